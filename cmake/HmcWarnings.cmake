# hmc::warnings: the warning set every hmc target builds with.
add_library(hmc_warnings INTERFACE)
add_library(hmc::warnings ALIAS hmc_warnings)
target_compile_options(hmc_warnings INTERFACE
  $<$<CXX_COMPILER_ID:GNU,Clang>:-Wall -Wextra -Wpedantic -Wno-unused-parameter>)
install(TARGETS hmc_warnings EXPORT hmcTargets)
