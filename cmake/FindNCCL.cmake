# FindNCCL: the NVIDIA Collective Communications Library.
#
# Imported target:
#   NCCL::nccl           the shared library and its include directory
# Result variables:
#   NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION (from nccl.h: "2.28.9")
# Hints, searched first, in this order:
#   NCCL_ROOT, NCCL_HOME (CMake or environment variables): an installation prefix
#   NCCL_PIP_DIR: the `nvidia/nccl` folder of a pip wheel (nvidia-nccl-cu12/-cu13), the NCCL
#     that pip torch loads. It holds include/nccl.h and lib/libnccl.so.2 (no unversioned
#     libnccl.so), so the versioned name is searched too.
# Then: the environment's CUDAToolkit_ROOT and CUDA_HOME, the library root that
# find_package(CUDAToolkit) found, /usr/local/cuda, and CMake's default places.
# Results are cached: to switch to another NCCL, clear NCCL_INCLUDE_DIR and NCCL_LIBRARY.
# Only the shared library is searched: the process must load exactly one libnccl.so.2, the
# same one torch loads.

# Explicit hints are searched alone first, so that a CMAKE_PREFIX_PATH or system NCCL never
# shadows the one asked for; then the usual places.
set(_nccl_hints)
foreach(_nccl_var NCCL_ROOT NCCL_HOME NCCL_PIP_DIR)
  if(DEFINED ${_nccl_var} AND NOT "${${_nccl_var}}" STREQUAL "")
    list(APPEND _nccl_hints "${${_nccl_var}}")
  endif()
  if(DEFINED ENV{${_nccl_var}} AND NOT "$ENV{${_nccl_var}}" STREQUAL "")
    list(APPEND _nccl_hints "$ENV{${_nccl_var}}")
  endif()
endforeach()
set(_nccl_fallbacks)
foreach(_nccl_var CUDAToolkit_ROOT CUDA_HOME)
  if(DEFINED ENV{${_nccl_var}} AND NOT "$ENV{${_nccl_var}}" STREQUAL "")
    list(APPEND _nccl_fallbacks "$ENV{${_nccl_var}}")
  endif()
endforeach()
if(DEFINED CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _nccl_fallbacks "${CUDAToolkit_LIBRARY_ROOT}")
endif()
list(APPEND _nccl_fallbacks /usr/local/cuda)

if(_nccl_hints)
  find_path(NCCL_INCLUDE_DIR nccl.h
    HINTS ${_nccl_hints} PATH_SUFFIXES include NO_DEFAULT_PATH)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
    HINTS ${_nccl_hints} PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
endif()
find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${_nccl_fallbacks}
  PATH_SUFFIXES include
  DOC "Folder holding nccl.h")
find_library(NCCL_LIBRARY
  NAMES nccl libnccl.so.2
  HINTS ${_nccl_fallbacks}
  PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu
  DOC "The NCCL shared library")

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_version_lines
       REGEX "^#define NCCL_(MAJOR|MINOR|PATCH)[ \t]+[0-9]+")
  foreach(_nccl_part MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${_nccl_part}[ \t]+([0-9]+)" _nccl_match "${_nccl_version_lines}")
    set(NCCL_VERSION_${_nccl_part} "${CMAKE_MATCH_1}")
  endforeach()
  if(NOT "${NCCL_VERSION_MAJOR}" STREQUAL "")
    set(NCCL_VERSION "${NCCL_VERSION_MAJOR}.${NCCL_VERSION_MINOR}.${NCCL_VERSION_PATCH}")
  endif()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)

if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl SHARED IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()

unset(_nccl_hints)
unset(_nccl_fallbacks)
unset(_nccl_var)
unset(_nccl_part)
unset(_nccl_match)
unset(_nccl_version_lines)
