# Refuses to build a Python module that carries its own copy of libstdc++.
#
# Why: torch (and pybind11, MPI's C++ parts) load the distribution's libstdc++.so.6. A module
# linked with the static libstdc++ (`-static-libstdc++`, or a compiler wrapper whose `-B` folder
# offers only libstdc++.a) brings a second copy of the library into that process: two sets of
# locale facets, two `std::locale::classic()`. It builds and imports fine, then its first
# `std::ostream << long` dereferences a facet pointer of the other copy and segfaults (seen on a
# GPU machine whose CC/CXX/CUDAHOSTCXX named such a wrapper: every collective crashed in the
# background thread, in std::ostream::_M_insert<long>).
#
# How (at configure time, for each compiler that links our modules):
#   1. build a tiny shared library with the compiler and the project's flags, the way a module is
#      linked, and ask `nm -D --defined-only` whether it defines symbols that only libstdc++
#      itself defines (std::ostream::_M_insert<long>, std::locale::classic(), __cxa_throw ...);
#      a module that links libstdc++.so.6 leaves them undefined;
#   2. if it does, name the compiler's own libstdc++.so (`<compiler> -print-file-name=
#      libstdc++.so`) on every link line (CMAKE_<LANG>_STANDARD_LIBRARIES: after our inputs, but
#      before the static archive that the compiler driver appends), so the archive is left with
#      nothing to supply; build the probe again that way and check it defines nothing of
#      libstdc++'s;
#   3. if that does not help, stop with one message naming the compiler variable, what the
#      compiler does and the fix (CXX=/usr/bin/g++).
# Belt and braces: hvdl_libstdcxx_check_module(target) checks the real module after every link
# (this file run as a script) and deletes it when it defines libstdc++'s symbols, so a module
# like that never stays around to be imported.
#
#   hvdl_libstdcxx_guard(CXX)    the C++ compiler (CXX / CMAKE_CXX_COMPILER)
#   hvdl_libstdcxx_guard(CUDA)   nvcc with its host compiler (CUDAHOSTCXX /
#                                CMAKE_CUDA_HOST_COMPILER), after enable_language(CUDA) or with
#                                CMAKE_CUDA_COMPILER set
#   cmake -DHVDL_MODULE=<file> [-DHVDL_NM=nm] -P cmake/HvdlLibstdcxx.cmake   the post-link check

# Symbols that user code never defines (explicit instantiations and non-template members compiled
# into libstdc++, the C++ ABI runtime): any of them in a module's dynamic symbol table means the
# module carries libstdc++. std::ostream::_M_insert<long> is weak in the archive, the rest strong.
set(HVDL_LIBSTDCXX_MARKERS
    "_ZNSo9_M_insertI[a-z]EERSoT_|_ZNSt6locale7classicEv|_ZNSt8ios_base4InitC[12]Ev|__cxa_throw|__cxa_allocate_exception|__gxx_personality_v0")

# The libstdc++ symbols `nm -D --defined-only` lists for `file`, as a list in `out` (empty: none).
function(hvdl_libstdcxx_defined out nm file)
  execute_process(COMMAND "${nm}" -D --defined-only "${file}" OUTPUT_VARIABLE _syms
                  ERROR_VARIABLE _err RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "horovodlite: `${nm} -D --defined-only ${file}` failed: ${_err}")
  endif()
  string(REGEX MATCHALL "[ \t](${HVDL_LIBSTDCXX_MARKERS})\n" _found "${_syms}")
  string(REGEX REPLACE "[ \t\n]" "" _found "${_found}")
  set(${out} "${_found}" PARENT_SCOPE)
endfunction()

# Links the probe library with `command` (a list: the compiler and its flags) plus `extra`
# (a list), and sets `out` to "dynamic", "static" or "failed: <compiler output>".
function(_hvdl_libstdcxx_probe out tag command extra)
  set(_dir "${CMAKE_BINARY_DIR}/hvdl_libstdcxx_probe")
  file(MAKE_DIRECTORY "${_dir}")
  file(WRITE "${_dir}/probe.cc"
       "#include <sstream>\n#include <string>\n"
       "std::string hvdl_libstdcxx_probe(long v) {\n"
       "  std::ostringstream s;\n  s << v;\n  return s.str();\n}\n")
  set(_lib "${_dir}/probe_${tag}.so")
  file(REMOVE "${_lib}")
  execute_process(COMMAND ${command} probe.cc ${extra} -o "${_lib}" WORKING_DIRECTORY "${_dir}"
                  OUTPUT_VARIABLE _log ERROR_VARIABLE _log RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0 OR NOT EXISTS "${_lib}")
    string(REPLACE ";" " " _shown "${command} probe.cc ${extra}")
    set(${out} "failed: `${_shown}`: ${_log}" PARENT_SCOPE)
    return()
  endif()
  hvdl_libstdcxx_defined(_found "${HVDL_LIBSTDCXX_NM}" "${_lib}")
  if(_found)
    set(${out} "static" PARENT_SCOPE)
  else()
    set(${out} "dynamic" PARENT_SCOPE)
  endif()
endfunction()

function(_hvdl_split out text)
  separate_arguments(_list UNIX_COMMAND "${text}")
  set(${out} ${_list} PARENT_SCOPE)
endfunction()

# Probes the compiler that links `lang` (CXX or CUDA); see the top of this file.
function(hvdl_libstdcxx_guard lang)
  if(NOT CMAKE_SYSTEM_NAME STREQUAL "Linux")
    return()
  endif()
  set(HVDL_LIBSTDCXX_NM "${CMAKE_NM}")
  if(NOT HVDL_LIBSTDCXX_NM)
    find_program(HVDL_LIBSTDCXX_NM nm)
  endif()
  if(NOT HVDL_LIBSTDCXX_NM)
    message(WARNING "horovodlite: no `nm` found; cannot check how ${lang} links libstdc++")
    return()
  endif()
  string(TOUPPER "${CMAKE_BUILD_TYPE}" _type)
  # Python modules are MODULE libraries: linked with CMAKE_MODULE_LINKER_FLAGS (LDFLAGS).
  _hvdl_split(_shared "${CMAKE_MODULE_LINKER_FLAGS} ${CMAKE_MODULE_LINKER_FLAGS_${_type}}")
  if(lang STREQUAL "CXX")
    set(_var "CXX")
    set(_compiler "${CMAKE_CXX_COMPILER}")
    _hvdl_split(_flags "${CMAKE_CXX_COMPILER_ARG1} ${CMAKE_CXX_FLAGS}")
    set(_command "${CMAKE_CXX_COMPILER}" ${_flags} -shared -fPIC ${_shared})
    set(_host "${CMAKE_CXX_COMPILER}" ${CMAKE_CXX_COMPILER_ARG1})
  elseif(lang STREQUAL "CUDA")
    # nvcc links through its host compiler: the one named, else the one CMake saw nvcc use.
    set(_var "CUDAHOSTCXX")
    set(_compiler "${CMAKE_CUDA_HOST_COMPILER}")
    set(_ccbin "")
    if(_compiler)
      set(_ccbin -ccbin "${_compiler}")
    elseif(CMAKE_CUDA_HOST_LINK_LAUNCHER)
      set(_compiler "${CMAKE_CUDA_HOST_LINK_LAUNCHER}")
    else()
      set(_compiler "g++")
    endif()
    # The linker flags are the CXX probe's business (nvcc does not take -Wl, options).
    _hvdl_split(_flags "${CMAKE_CUDA_FLAGS}")
    set(_command "${CMAKE_CUDA_COMPILER}" ${_ccbin} ${_flags} -shared -Xcompiler=-fPIC)
    set(_host "${_compiler}")
  else()
    message(FATAL_ERROR "hvdl_libstdcxx_guard: expected CXX or CUDA, got ${lang}")
  endif()

  _hvdl_libstdcxx_probe(_how "${lang}" "${_command}" "")
  if(_how STREQUAL "dynamic")
    return()
  elseif(_how MATCHES "^failed")
    message(WARNING "horovodlite: could not link a test library to check how ${_var}="
                    "${_compiler} links libstdc++ (${_how}); the module is checked after it is "
                    "linked instead.")
    return()
  endif()

  # Static: link the compiler's own libstdc++.so explicitly, and check that this is enough.
  execute_process(COMMAND ${_host} -print-file-name=libstdc++.so OUTPUT_VARIABLE _so
                  OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  set(_fixed "")
  if(IS_ABSOLUTE "${_so}" AND EXISTS "${_so}")
    _hvdl_libstdcxx_probe(_fixed "${lang}_fixed" "${_command}" "${_so}")
  endif()
  if(_fixed STREQUAL "dynamic")
    message(STATUS "horovodlite: ${_var}=${_compiler} links libstdc++ statically into shared "
                   "libraries; linking ${_so} explicitly, so that the module uses the one "
                   "libstdc++ of the process (docs/troubleshooting.md)")
    set(CMAKE_${lang}_STANDARD_LIBRARIES "${CMAKE_${lang}_STANDARD_LIBRARIES} \"${_so}\""
        PARENT_SCOPE)
    return()
  endif()
  if(NOT _so OR NOT IS_ABSOLUTE "${_so}")
    set(_tried "and it names no libstdc++.so of its own (-print-file-name=libstdc++.so)")
  else()
    set(_tried "even with ${_so} named explicitly")
  endif()
  message(FATAL_ERROR
    "horovodlite: the compiler ${_var}=${_compiler} links libstdc++ statically into shared "
    "libraries (a test library built with it defines std::ostream::_M_insert<long> itself), "
    "${_tried}. A module built that way carries a second libstdc++ next to the libstdc++.so.6 "
    "that torch loads, and crashes at the first collective. Build with the distribution's "
    "compiler: CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++ pip install "
    "--no-build-isolation -e . (see docs/troubleshooting.md).")
endfunction()

# After each link of `target`, fails the build and deletes the file if it defines libstdc++.
function(hvdl_libstdcxx_check_module target)
  if(NOT CMAKE_SYSTEM_NAME STREQUAL "Linux")
    return()
  endif()
  set(_nm "${CMAKE_NM}")
  if(NOT _nm)
    set(_nm nm)
  endif()
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND "${CMAKE_COMMAND}" "-DHVDL_MODULE=$<TARGET_FILE:${target}>" "-DHVDL_NM=${_nm}"
            "-DHVDL_COMPILER=${CMAKE_CXX_COMPILER}" -P "${CMAKE_CURRENT_FUNCTION_LIST_FILE}"
    VERBATIM)
endfunction()

# Script mode: the post-link check of HVDL_MODULE.
if(CMAKE_SCRIPT_MODE_FILE AND CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  if(NOT HVDL_NM)
    set(HVDL_NM nm)
  endif()
  hvdl_libstdcxx_defined(_found "${HVDL_NM}" "${HVDL_MODULE}")
  if(_found)
    file(REMOVE "${HVDL_MODULE}")
    list(FIND _found "_ZNSo9_M_insertIlEERSoT_" _at)  # where the crash was seen: named first
    if(_at GREATER 0)
      list(REMOVE_AT _found ${_at})
      list(PREPEND _found "_ZNSo9_M_insertIlEERSoT_")
    endif()
    list(LENGTH _found _count)
    list(SUBLIST _found 0 3 _first)
    list(JOIN _first ", " _names)
    if(_count GREATER 3)
      string(APPEND _names " ... ${_count} of the symbols looked for")
    endif()
    message(FATAL_ERROR
      "horovodlite: ${HVDL_MODULE} defines libstdc++'s own symbols (${_names}): it was linked "
      "with the static libstdc++ and would crash next to the libstdc++.so.6 that torch loads; "
      "deleted it. The compiler (CXX=${HVDL_COMPILER}) or the link flags take the static "
      "library; build with the distribution's compiler: CC=/usr/bin/gcc CXX=/usr/bin/g++ "
      "(see docs/troubleshooting.md).")
  endif()
endif()
