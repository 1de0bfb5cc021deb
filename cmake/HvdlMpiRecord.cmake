# What the extension was built against, and where it finds its libraries once installed.
#
# hvdl_record_mpi(target): writes _mpi_build.json beside the target's output (the horovodlite
#   package folder): the MPI compiler wrapper, its MPI standard version, the library's own version
#   string (MPI_Get_library_version, run at configure time) and the libraries linked. At import,
#   horovodlite compares it with the MPI library actually loaded and with the launcher that
#   started the process (horovodlite/_mpi_check.py); the launcher picks the matching mpirun.
#
# hvdl_relocatable_rpath(target dir-or-library...) (wheels, HVDL_RELOCATABLE=ON): the RUNPATH
#   names each library folder relative to where the module will be installed
#   ($ORIGIN/../torch/lib, $ORIGIN/../../.. for the PyPI MPI packages that install into the
#   environment's lib/) when the folder lies inside the environment (HVDL_RELOCATE_PREFIX); other
#   folders (a system or module MPI) stay absolute. Without it, the build tree's absolute RUNPATH
#   is used, which is right for an editable install.
option(HVDL_RELOCATABLE "RUNPATH relative to the installed module (wheels)" OFF)
set(HVDL_INSTALL_DIR "" CACHE PATH "Folder the module is installed to (HVDL_RELOCATABLE)")
set(HVDL_RELOCATE_PREFIX "" CACHE PATH "Environment prefix whose folders become $ORIGIN-relative")

function(hvdl_record_mpi target)
  set(json "{}")
  if(NOT HVDL_MPI)  # a build without MPI says so: nothing to check at import
    string(JSON json SET "${json}" mpi "false")
    _hvdl_write_record(${target} "${json}")
    return()
  endif()
  string(JSON json SET "${json}" compiler "\"${MPI_C_COMPILER}\"")
  string(JSON json SET "${json}" mpi_version "\"${MPI_C_VERSION}\"")
  set(version "${MPI_C_LIBRARY_VERSION_STRING}")
  string(REPLACE "\\" "\\\\" version "${version}")
  string(REPLACE "\"" "\\\"" version "${version}")
  string(REPLACE "\n" "\\n" version "${version}")
  string(REPLACE "\t" " " version "${version}")
  string(JSON json SET "${json}" library_version "\"${version}\"")
  set(libs "[]")
  set(i 0)
  foreach(lib IN LISTS MPI_C_LIBRARIES)
    string(JSON libs SET "${libs}" ${i} "\"${lib}\"")
    math(EXPR i "${i} + 1")
  endforeach()
  string(JSON json SET "${json}" libraries "${libs}")
  _hvdl_write_record(${target} "${json}")
endfunction()

function(_hvdl_write_record target json)
  get_target_property(out_dir ${target} LIBRARY_OUTPUT_DIRECTORY)
  if(NOT out_dir)
    set(out_dir "${CMAKE_LIBRARY_OUTPUT_DIRECTORY}")
  endif()
  if(NOT out_dir)
    set(out_dir "${CMAKE_BINARY_DIR}")
  endif()
  file(WRITE "${out_dir}/_mpi_build.json" "${json}\n")
endfunction()

function(hvdl_relocatable_rpath target)
  if(NOT HVDL_INSTALL_DIR OR NOT HVDL_RELOCATE_PREFIX)
    message(FATAL_ERROR "HVDL_RELOCATABLE needs HVDL_INSTALL_DIR and HVDL_RELOCATE_PREFIX")
  endif()
  set(rpath "")
  foreach(item IN LISTS ARGN)
    if(NOT IS_ABSOLUTE "${item}")
      continue()
    endif()
    if(IS_DIRECTORY "${item}")
      set(dir "${item}")
    else()
      get_filename_component(dir "${item}" DIRECTORY)
    endif()
    get_filename_component(dir "${dir}" REALPATH)
    get_filename_component(prefix "${HVDL_RELOCATE_PREFIX}" REALPATH)
    string(FIND "${dir}/" "${prefix}/" at)
    if(at EQUAL 0)
      file(RELATIVE_PATH rel "${HVDL_INSTALL_DIR}" "${dir}")
      set(dir "$ORIGIN/${rel}")
    endif()
    list(APPEND rpath "${dir}")
  endforeach()
  list(TRANSFORM rpath REPLACE "/+$" "")
  list(REMOVE_DUPLICATES rpath)
  # An MPI wrapper's own "-Wl,-rpath,<its lib>" (PyPI's Open MPI and MPICH have one) would put
  # the build environment's absolute path back in: drop it from the MPI target's link options
  # (FindMPI writes its commas as $<COMMA>).
  if(TARGET MPI::MPI_C)
    get_target_property(options MPI::MPI_C INTERFACE_LINK_OPTIONS)
  endif()
  if(options)
    string(REGEX REPLACE "-Wl(,|\\$<COMMA>)-rpath( +-Wl)?(,|\\$<COMMA>)[^ ;>]+" "" options "${options}")
    set_target_properties(MPI::MPI_C PROPERTIES INTERFACE_LINK_OPTIONS "${options}")
  endif()
  set_target_properties(${target} PROPERTIES BUILD_WITH_INSTALL_RPATH ON INSTALL_RPATH "${rpath}")
  message(STATUS "horovodlite: relocatable RUNPATH ${rpath}")
endfunction()
