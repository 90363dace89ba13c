#pragma once
// LibTorch's glog defines CHECK, CHECK_EQ, ... which would replace doctest's assertions.
// Torch tests include this instead of both headers: torch first, then doctest's macros win.

#include <torch/cuda.h>
#include <torch/types.h>

#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LT
#undef CHECK_LE
#undef CHECK_GT
#undef CHECK_GE
#undef CHECK_NOTNULL

#include <doctest/doctest.h>
