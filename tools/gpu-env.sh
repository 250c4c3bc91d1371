# Sourced by the scripts that run ON THE GPU MACHINE (gpu-check.sh, gpu-profile.sh): from the
# repository root, $OUT made, the carried build (.device-build/, tools/gpu-build.sh) unpacked as
# $B, its libraries and the test data on the environment.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
B=.device-build
[ -d "$B" ] || tar -xJf .device-build.tar.xz
export LD_LIBRARY_PATH="$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LILAC_TEST_DATA="$PWD/tests/data"
