# HMC_WITH_GLOO (AUTO|ON|OFF) -> HMC_HAVE_GLOO (0/1) for hmc/config.hpp.
# The gloo transport needs LibTorch's ProcessGroupGloo header and the gloo headers it
# includes (Debian: libtorch-dev and libgloo-dev; pip wheels ship both under torch/include).
set(HMC_HAVE_GLOO 0)
if(NOT HMC_WITH_GLOO STREQUAL "OFF")
  find_path(HMC_GLOO_PG_INCLUDE_DIR torch/csrc/distributed/c10d/ProcessGroupGloo.hpp
    HINTS ${TORCH_INCLUDE_DIRS})
  find_path(HMC_GLOO_INCLUDE_DIR gloo/context.h HINTS ${TORCH_INCLUDE_DIRS})
  # The gloo transport calls gloo itself (gloo::Context::setTimeout, gloo_transport.cpp). Debian's
  # libtorch_cpu needs gloo as a shared library (libgloo.so.0), which hmc then links too; pip
  # wheels carry gloo inside libtorch_cpu: nothing more to link (and a system libgloo must not be).
  if(TARGET torch_cpu AND CMAKE_OBJDUMP)
    get_target_property(_hmc_torch_cpu torch_cpu LOCATION)
    if(_hmc_torch_cpu)
      execute_process(COMMAND ${CMAKE_OBJDUMP} -p ${_hmc_torch_cpu} OUTPUT_VARIABLE _hmc_needed
                      ERROR_QUIET)
      if(_hmc_needed MATCHES "NEEDED +libgloo\\.so")
        find_library(HMC_GLOO_LIBRARY NAMES gloo)
      endif()
    endif()
  endif()
  if(HMC_GLOO_PG_INCLUDE_DIR AND HMC_GLOO_INCLUDE_DIR)
    set(HMC_HAVE_GLOO 1)
    message(STATUS "hmc: gloo transport enabled (${HMC_GLOO_INCLUDE_DIR})")
  elseif(HMC_WITH_GLOO STREQUAL "ON")
    message(FATAL_ERROR "HMC_WITH_GLOO=ON but ProcessGroupGloo.hpp (${HMC_GLOO_PG_INCLUDE_DIR}) "
                        "or gloo/context.h (${HMC_GLOO_INCLUDE_DIR}) was not found; "
                        "install libgloo-dev or set HMC_WITH_GLOO=OFF")
  else()
    message(WARNING "hmc: gloo headers not found (install libgloo-dev); the gloo transport is "
                    "disabled. Set HMC_WITH_GLOO=OFF to silence this.")
  endif()
endif()
