// What crashed in _C when it carried its own libstdc++: formatting a long through std::ostream.
#include <sstream>
#include <string>

extern "C" int guarded_format(long value, char* out, int size) {
  std::ostringstream text;
  text << "[" << value << "]";
  const std::string s = text.str();
  if (static_cast<int>(s.size()) >= size) return -1;
  s.copy(out, s.size());
  out[s.size()] = '\0';
  return static_cast<int>(s.size());
}
