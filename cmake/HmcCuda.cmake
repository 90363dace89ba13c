# HMC_WITH_CUDA (AUTO|ON|OFF) -> HMC_HAVE_CUDA (ON/OFF), the CUDA toolkit (CUDA::cudart)
# and NCCL (NCCL::nccl). AUTO turns CUDA on when both are found and warns otherwise; ON fails
# the configure when either is missing; OFF never looks. Plain C++ against the CUDA runtime:
# no CUDA language (nvcc) is needed for hmc's own code.

string(TOUPPER "${HMC_WITH_CUDA}" _hmc_with_cuda)
if(NOT _hmc_with_cuda MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "HMC_WITH_CUDA must be AUTO, ON or OFF, not '${HMC_WITH_CUDA}'")
endif()

set(HMC_HAVE_CUDA OFF)
if(NOT _hmc_with_cuda STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    find_package(NCCL QUIET)
  endif()

  set(_hmc_cuda_missing)
  if(NOT CUDAToolkit_FOUND)
    list(APPEND _hmc_cuda_missing "the CUDA toolkit (set CUDAToolkit_ROOT or put nvcc on PATH)")
  elseif(NOT NCCL_FOUND)
    list(APPEND _hmc_cuda_missing
         "NCCL (set NCCL_ROOT, NCCL_HOME or NCCL_PIP_DIR to the pip wheel's nvidia/nccl folder)")
  endif()

  if(_hmc_cuda_missing)
    string(REPLACE ";" " and " _hmc_cuda_missing "${_hmc_cuda_missing}")
    if(_hmc_with_cuda STREQUAL "ON")
      message(FATAL_ERROR "HMC_WITH_CUDA=ON but ${_hmc_cuda_missing} was not found")
    endif()
    message(WARNING "hmc: building without CUDA: ${_hmc_cuda_missing} was not found "
                    "(HMC_WITH_CUDA=AUTO; pass -DHMC_WITH_CUDA=OFF to silence this)")
  else()
    set(HMC_HAVE_CUDA ON)
    message(STATUS "hmc: CUDA ${CUDAToolkit_VERSION} (${CUDAToolkit_LIBRARY_DIR}), "
                   "NCCL ${NCCL_VERSION} (${NCCL_LIBRARY})")
  endif()
endif()
unset(_hmc_with_cuda)
unset(_hmc_cuda_missing)
