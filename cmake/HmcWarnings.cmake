# hmc::warnings: the warning set every hmc target builds with.
add_library(hmc_warnings INTERFACE)
add_library(hmc::warnings ALIAS hmc_warnings)
target_compile_options(hmc_warnings INTERFACE
  $<$<CXX_COMPILER_ID:GNU,Clang>:-Wall -Wextra -Wpedantic -Wno-unused-parameter>)
install(TARGETS hmc_warnings EXPORT hmcTargets)
# A unity build includes each .cpp into a batch file, and GCC then takes a type of one file's
# anonymous namespace used by a class of the same file for a header's (-Wsubobject-linkage):
# true only of headers, which hmc's anonymous namespaces never are.
if(HMC_UNITY_BUILD)
  target_compile_options(hmc_warnings INTERFACE
    $<$<CXX_COMPILER_ID:GNU>:-Wno-subobject-linkage>)
endif()
