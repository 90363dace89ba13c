#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, then configures, builds and runs a small
# program that finds hmc with find_package(hmc CONFIG) and binds and closes a module; and
# checks that the installed hmc-run (bin/, torch-free) finds its runner (libexec/) for a run;
# and builds the embedding example (examples/, hmc::world) against the installed package, outside
# the source tree (in the consumer's configure), and runs it as a world of one rank (HMC_RANK,
# HMC_WORLD_SIZE).
# usage: check_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"
source="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
cmake -S "$source/tests/install/consumer" -B "$work/consumer" -G Ninja \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DHMC_EXAMPLES_DIR="$source/examples" \
  > "$work/configure.log" 2>&1 \
  || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/consumer" > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$work/consumer/consumer"
hmc_run="$work/prefix/bin/hmc-run"
if [ -x "$hmc_run" ]; then  # a build with HMC_WITH_TORCH=OFF installs no hmc-run
  "$hmc_run" validate "$source/scenarios/quickstart.json" > "$work/validate.log" \
    || { echo "installed hmc-run validate failed:"; cat "$work/validate.log"; exit 1; }
  "$hmc_run" "$source/scenarios/quickstart.json" --quiet > "$work/run.log" 2>&1 \
    || { echo "installed hmc-run did not run the quickstart scenario:"; cat "$work/run.log"; exit 1; }
  grep -q "^# OK" "$work/run.log" \
    || { echo "installed hmc-run printed no '# OK':"; cat "$work/run.log"; exit 1; }
  echo "installed hmc-run ran the quickstart scenario through its runner"
  example="$work/consumer/examples/hmc-train-loop"
  [ -x "$example" ] || { echo "the embedding example was not built against the installed package (no hmc::world?):"; cat "$work/configure.log"; exit 1; }
  HMC_RANK=0 HMC_WORLD_SIZE=1 HMC_MASTER_PORT=0 HMC_NAME=installed \
    "$example" --steps 3 > "$work/example.log" 2>&1 \
    || { echo "the example built against the installed package failed:"; cat "$work/example.log"; exit 1; }
  grep -q "^# OK: every rank of 1 ended cleanly" "$work/example.log" \
    || { echo "the installed example printed no clean end:"; cat "$work/example.log"; exit 1; }
  echo "the embedding example built against the installed package joined a world and ended it"
fi
echo "1 passed, 0 failed"
