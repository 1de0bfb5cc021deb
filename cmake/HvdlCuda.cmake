# Decides whether this build has CUDA kernels (HVDL_CUDA) and the NCCL backend (HVDL_NCCL), and
# says so in one status line naming what was found and what was not.
#
# Inputs (cache): HVDL_WITH_CUDA and HVDL_WITH_NCCL, each AUTO (default), ON or OFF;
# HVDL_CUDA_COMPILE_CHECK (CUDA + NCCL forced on, torch's CUDA not required: see CMakeLists.txt);
# HVDL_NCCL_ROOT (a folder with include/nccl.h and lib/libnccl.so*); HVDL_CUDA_ARCHITECTURES.
#
#   CUDA is ON   when HVDL_WITH_CUDA=ON, or AUTO and torch was built with CUDA and nvcc is found.
#   NCCL is ON   when CUDA is on and HVDL_WITH_NCCL=ON, or AUTO and NCCL is found.
#   ON with something missing is a configure error naming it.
#
# torch's CUDA is read from torch/version.py (no Python start-up, so the CPU-only configure stays
# fast). nvcc: CMAKE_CUDA_COMPILER, $CUDACXX, $CUDA_HOME/bin, $CUDA_PATH/bin, PATH,
# /usr/local/cuda/bin. NCCL, first match wins: HVDL_NCCL_ROOT / $NCCL_ROOT / $NCCL_HOME, the
# nvidia-nccl-cu13 / nvidia-nccl-cu12 PyPI package of this Python (`import nvidia.nccl`, the NCCL
# a CUDA torch wheel loads), then the CUDA toolkit and system folders.
# Outputs: HVDL_CUDA, HVDL_NCCL, HVDL_NCCL_INCLUDE_DIR, HVDL_NCCL_LIBRARY, HVDL_NCCL_VERSION and,
# with CUDA, the CUDA language enabled and the CUDA::cudart target.

set(_hvdl_found "")
set(_hvdl_missing "")

# --- torch's CUDA ------------------------------------------------------------------------------
set(HVDL_TORCH_CUDA "")
set(HVDL_TORCH_VERSION "")
if(DEFINED TORCH_INSTALL_PREFIX AND EXISTS "${TORCH_INSTALL_PREFIX}/version.py")
  file(STRINGS "${TORCH_INSTALL_PREFIX}/version.py" _hvdl_lines REGEX "^(__version__|cuda)")
  foreach(_line IN LISTS _hvdl_lines)
    if(_line MATCHES "^__version__ *= *'([^']*)'")
      set(HVDL_TORCH_VERSION "${CMAKE_MATCH_1}")
    elseif(_line MATCHES "^cuda[^=]*= *'([^']*)'")
      set(HVDL_TORCH_CUDA "${CMAKE_MATCH_1}")
    endif()
  endforeach()
endif()
set(_hvdl_need_torch_cuda ${HVDL_BUILD_TORCH})
if(HVDL_CUDA_COMPILE_CHECK)
  set(_hvdl_need_torch_cuda OFF)  # compile/link check: torch headers only, no torch module
endif()
if(NOT _hvdl_need_torch_cuda)
  set(_hvdl_torch_ok ON)
elseif(HVDL_TORCH_CUDA)
  set(_hvdl_torch_ok ON)
  list(APPEND _hvdl_found "torch ${HVDL_TORCH_VERSION} with CUDA ${HVDL_TORCH_CUDA}")
else()
  set(_hvdl_torch_ok OFF)
  list(APPEND _hvdl_missing
       "torch ${HVDL_TORCH_VERSION} was built without CUDA (torch.version.cuda is None)")
endif()
if(HVDL_TORCH_CPU_IMPORT AND _hvdl_need_torch_cuda)  # cmake/HvdlTorch.cmake: no toolkit libs
  set(_hvdl_torch_ok OFF)
  string(CONCAT _hvdl_why "the CUDA toolkit's libraries (cudart, NVRTC) for torch's CUDA "
         "${HVDL_TORCH_CUDA} (set CUDA_HOME to a whole CUDA toolkit of that version)")
  list(APPEND _hvdl_missing "${_hvdl_why}")
endif()

# --- nvcc --------------------------------------------------------------------------------------
if(CMAKE_CUDA_COMPILER)
  set(HVDL_NVCC "${CMAKE_CUDA_COMPILER}")
else()
  find_program(HVDL_NVCC NAMES nvcc
               HINTS "$ENV{CUDACXX}/.." "$ENV{CUDA_HOME}/bin" "$ENV{CUDA_PATH}/bin"
               PATHS /usr/local/cuda/bin)
  if(DEFINED ENV{CUDACXX} AND EXISTS "$ENV{CUDACXX}")
    set(HVDL_NVCC "$ENV{CUDACXX}")
  endif()
endif()
set(HVDL_NVCC_VERSION "")
if(HVDL_NVCC)
  execute_process(COMMAND "${HVDL_NVCC}" --version OUTPUT_VARIABLE _hvdl_nvcc_out
                  ERROR_QUIET RESULT_VARIABLE _hvdl_nvcc_rc)
  if(_hvdl_nvcc_rc EQUAL 0 AND _hvdl_nvcc_out MATCHES "release ([0-9]+\\.[0-9]+)")
    set(HVDL_NVCC_VERSION "${CMAKE_MATCH_1}")
    list(APPEND _hvdl_found "nvcc ${HVDL_NVCC_VERSION} (${HVDL_NVCC})")
  else()
    set(HVDL_NVCC "")
  endif()
endif()
if(NOT HVDL_NVCC)
  list(APPEND _hvdl_missing "nvcc (set CUDACXX or CUDA_HOME, or put nvcc on PATH)")
endif()

# --- CUDA on or off ----------------------------------------------------------------------------
string(TOUPPER "${HVDL_WITH_CUDA}" _hvdl_cuda_opt)
string(TOUPPER "${HVDL_WITH_NCCL}" _hvdl_nccl_opt)
if(HVDL_CUDA_COMPILE_CHECK)
  set(_hvdl_cuda_opt ON)
  set(_hvdl_nccl_opt ON)
endif()
set(HVDL_CUDA OFF)
if(_hvdl_cuda_opt STREQUAL "ON" OR (_hvdl_cuda_opt STREQUAL "AUTO" AND _hvdl_torch_ok AND HVDL_NVCC))
  set(HVDL_CUDA ON)
elseif(NOT _hvdl_cuda_opt MATCHES "^(AUTO|OFF)$")
  message(FATAL_ERROR "HVDL_WITH_CUDA=${HVDL_WITH_CUDA}: expected AUTO, ON or OFF")
endif()
if(HVDL_CUDA AND (NOT _hvdl_torch_ok OR NOT HVDL_NVCC))
  list(JOIN _hvdl_missing "; " _hvdl_why)
  message(FATAL_ERROR "horovodlite: HVDL_WITH_CUDA=ON, but the CUDA build cannot work here: "
          "${_hvdl_why}. Install a CUDA build of torch and the CUDA toolkit (nvcc), or configure "
          "with -DHVDL_WITH_CUDA=OFF (HVDL_WITH_CUDA=0 for setup.py).")
endif()

# --- NCCL --------------------------------------------------------------------------------------
function(_hvdl_python_nccl out)
  set(${out} "" PARENT_SCOPE)
  if(NOT Python_EXECUTABLE)
    return()
  endif()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
            "import nvidia.nccl as n; print(list(n.__path__)[0])"
    OUTPUT_VARIABLE _dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
  if(_rc EQUAL 0 AND EXISTS "${_dir}/include/nccl.h")
    set(${out} "${_dir}" PARENT_SCOPE)
  endif()
endfunction()

set(HVDL_NCCL OFF)
set(HVDL_NCCL_VERSION "")
if(HVDL_CUDA AND NOT _hvdl_nccl_opt STREQUAL "OFF")
  set(_hvdl_roots "${HVDL_NCCL_ROOT}" "$ENV{NCCL_ROOT}" "$ENV{NCCL_HOME}")
  list(FILTER _hvdl_roots EXCLUDE REGEX "^$")
  if(NOT _hvdl_roots)
    _hvdl_python_nccl(_hvdl_pip_nccl)
    set(_hvdl_roots "${_hvdl_pip_nccl}")
  endif()
  find_path(HVDL_NCCL_INCLUDE_DIR nccl.h HINTS ${_hvdl_roots} PATH_SUFFIXES include
            PATHS /usr/local/cuda /usr)
  find_library(HVDL_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_hvdl_roots}
               PATH_SUFFIXES lib lib64 PATHS /usr/local/cuda /usr /usr/lib/x86_64-linux-gnu)
  if(HVDL_NCCL_INCLUDE_DIR AND HVDL_NCCL_LIBRARY)
    file(STRINGS "${HVDL_NCCL_INCLUDE_DIR}/nccl.h" _hvdl_code REGEX "^#define NCCL_VERSION_CODE")
    string(REGEX MATCH "[0-9]+" HVDL_NCCL_VERSION "${_hvdl_code}")
    set(HVDL_NCCL ON)
    list(APPEND _hvdl_found "NCCL ${HVDL_NCCL_VERSION} (${HVDL_NCCL_LIBRARY})")
  else()
    string(REGEX MATCH "^[0-9]+" _hvdl_cuda_major "${HVDL_NVCC_VERSION}")
    list(APPEND _hvdl_missing
         "NCCL (nccl.h and libnccl: pip install nvidia-nccl-cu${_hvdl_cuda_major} or set HVDL_NCCL_ROOT)")
    if(_hvdl_nccl_opt STREQUAL "ON")
      list(JOIN _hvdl_missing "; " _hvdl_why)
      message(FATAL_ERROR "horovodlite: HVDL_WITH_NCCL=ON, but NCCL was not found: ${_hvdl_why}.")
    endif()
  endif()
elseif(NOT HVDL_CUDA)
  list(APPEND _hvdl_missing "NCCL not searched (needs CUDA)")
endif()

# --- report ------------------------------------------------------------------------------------
list(JOIN _hvdl_found "; " _hvdl_found_text)
list(JOIN _hvdl_missing "; " _hvdl_missing_text)
if(NOT _hvdl_found_text)
  set(_hvdl_found_text "nothing")
endif()
if(NOT _hvdl_missing_text)
  set(_hvdl_missing_text "nothing")
endif()
if(HVDL_CUDA_COMPILE_CHECK)
  set(_hvdl_found_text "${_hvdl_found_text} [compile check: CUDA and NCCL forced on]")
endif()
message(STATUS "horovodlite: CUDA ${HVDL_CUDA} (HVDL_WITH_CUDA=${HVDL_WITH_CUDA}), "
               "NCCL ${HVDL_NCCL} (HVDL_WITH_NCCL=${HVDL_WITH_NCCL}). "
               "Found: ${_hvdl_found_text}. Not found: ${_hvdl_missing_text}.")

# --- the CUDA language -------------------------------------------------------------------------
if(HVDL_CUDA)
  if(NOT CMAKE_CUDA_COMPILER)  # torch's CMake config may have enabled CUDA already
    set(CMAKE_CUDA_COMPILER "${HVDL_NVCC}")
  endif()
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    if(HVDL_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "${HVDL_CUDA_ARCHITECTURES}")
    elseif(HVDL_NVCC_VERSION VERSION_GREATER_EQUAL 13.0)
      set(CMAKE_CUDA_ARCHITECTURES 75 80 86 89 90 100 120)
    elseif(HVDL_NVCC_VERSION VERSION_GREATER_EQUAL 12.8)
      set(CMAKE_CUDA_ARCHITECTURES 70 75 80 86 89 90 100 120)
    elseif(HVDL_NVCC_VERSION VERSION_GREATER_EQUAL 11.8)
      set(CMAKE_CUDA_ARCHITECTURES 70 75 80 86 89 90)
    else()
      set(CMAKE_CUDA_ARCHITECTURES 70 75 80)
    endif()
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  message(STATUS "horovodlite: CUDA architectures ${CMAKE_CUDA_ARCHITECTURES}")
endif()
