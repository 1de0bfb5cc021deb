# Finds the installed torch: TORCH_INSTALL_PREFIX, TORCH_INCLUDE_DIRS, TORCH_LIBRARIES,
# TORCH_CXX_FLAGS, and HVDL_TORCH_CPU_IMPORT.
#
# torch's own package config (find_package(Torch)) stops with a fatal error whenever torch was
# built with CUDA and the CUDA toolkit's libraries (cudart, NVRTC) cannot be found. That is
# PyPI's torch (a CUDA build) on a machine with no CUDA toolkit, or a partial one: a laptop, a
# CPU CI runner, a login node. horovodlite's CPU parts need only torch's CPU libraries, so there
# (and under HVDL_WITH_CUDA=OFF) this file imports those itself (HVDL_TORCH_CPU_IMPORT ON), and
# cmake/HvdlCuda.cmake leaves the CUDA kernels out and says why. Everywhere else torch's own
# config is used, pointed at the toolkit CMake's FindCUDAToolkit found.
#
# Input: CMAKE_PREFIX_PATH or Torch_DIR leading to torch's share/cmake (setup.py passes it);
# HVDL_TORCH_OPTIONAL (a build that can do without torch: the CUDA compile check, which also
# needs only torch's headers).

set(HVDL_TORCH_CPU_IMPORT OFF)
set(_hvdl_torch_dir "")
foreach(_dir IN ITEMS "${Torch_DIR}" ${CMAKE_PREFIX_PATH})
  foreach(_candidate IN ITEMS "${_dir}" "${_dir}/Torch" "${_dir}/share/cmake/Torch")
    if(NOT _hvdl_torch_dir AND _dir AND EXISTS "${_candidate}/TorchConfig.cmake")
      get_filename_component(_hvdl_torch_dir "${_candidate}" ABSOLUTE)
    endif()
  endforeach()
endforeach()

set(_hvdl_torch_cuda "")
if(_hvdl_torch_dir)
  get_filename_component(_hvdl_prefix "${_hvdl_torch_dir}/../../.." ABSOLUTE)
  if(EXISTS "${_hvdl_prefix}/version.py")
    file(STRINGS "${_hvdl_prefix}/version.py" _hvdl_cuda_line REGEX "^cuda[^=]*= *'[^']+'")
    if(_hvdl_cuda_line MATCHES "'([^']+)'")
      set(_hvdl_torch_cuda "${CMAKE_MATCH_1}")
    endif()
  endif()
endif()
string(TOUPPER "${HVDL_WITH_CUDA}" _hvdl_with_cuda)
if(_hvdl_torch_cuda AND _hvdl_with_cuda STREQUAL "OFF")
  set(HVDL_TORCH_CPU_IMPORT ON)  # CUDA not wanted: no need for a toolkit
elseif(_hvdl_torch_cuda AND HVDL_CUDA_COMPILE_CHECK)
  set(HVDL_TORCH_CPU_IMPORT ON)  # the compile check needs torch's headers only
elseif(_hvdl_torch_cuda)
  # nvcc, the headers, cudart and NVRTC: what torch's config and its targets need.
  find_package(CUDAToolkit QUIET)
  if(NOT CUDAToolkit_FOUND OR NOT TARGET CUDA::nvrtc)
    set(HVDL_TORCH_CPU_IMPORT ON)
  elseif(NOT CUDA_TOOLKIT_ROOT_DIR AND NOT DEFINED ENV{CUDA_HOME} AND NOT DEFINED ENV{CUDA_PATH})
    # torch's config finds the toolkit from nvcc's folder; an nvcc reached through a wrapper
    # script (/usr/local/bin/nvcc running /usr/local/cuda-13.0/bin/nvcc) leads it to the
    # wrong root. The toolkit FindCUDAToolkit found is the one to use.
    get_filename_component(CUDA_TOOLKIT_ROOT_DIR "${CUDAToolkit_BIN_DIR}/.." ABSOLUTE)
    set(CUDA_TOOLKIT_ROOT_DIR "${CUDA_TOOLKIT_ROOT_DIR}" CACHE PATH "The CUDA toolkit")
  endif()
endif()

if(NOT HVDL_TORCH_CPU_IMPORT AND HVDL_TORCH_OPTIONAL)
  find_package(Torch QUIET)
  return()
elseif(NOT HVDL_TORCH_CPU_IMPORT)
  find_package(Torch REQUIRED)
  return()
endif()

# torch's CPU libraries, imported by hand. libtorch.so is left out: in a CUDA build it only
# pulls in libtorch_cuda.so and, through it, the CUDA runtime this machine lacks.
if(HVDL_CUDA_COMPILE_CHECK)
  message(STATUS "horovodlite: the CUDA compile check takes torch's headers only")
elseif(_hvdl_with_cuda STREQUAL "OFF")
  message(STATUS "horovodlite: HVDL_WITH_CUDA=OFF: linking torch's CPU libraries only")
else()
  message(STATUS "horovodlite: torch has CUDA ${_hvdl_torch_cuda}, but no whole CUDA toolkit "
                 "(nvcc, headers, cudart, NVRTC) was found: linking torch's CPU libraries only")
endif()
set(TORCH_INSTALL_PREFIX "${_hvdl_prefix}")
set(TORCH_INCLUDE_DIRS "${_hvdl_prefix}/include"
                       "${_hvdl_prefix}/include/torch/csrc/api/include")
set(TORCH_LIBRARIES "")
foreach(_lib IN ITEMS torch_cpu c10)
  find_library(HVDL_TORCH_${_lib}_LIBRARY ${_lib} PATHS "${_hvdl_prefix}/lib" NO_DEFAULT_PATH
               REQUIRED)
  list(APPEND TORCH_LIBRARIES "${HVDL_TORCH_${_lib}_LIBRARY}")
endforeach()
# The libstdc++ ABI torch was built with, as its config states it (older wheels: ABI 0).
file(STRINGS "${_hvdl_torch_dir}/TorchConfig.cmake" _hvdl_abi REGEX "_GLIBCXX_USE_CXX11_ABI=[01]")
string(REGEX MATCH "-D_GLIBCXX_USE_CXX11_ABI=[01]" TORCH_CXX_FLAGS "${_hvdl_abi}")
set(Torch_FOUND TRUE)
