#!/usr/bin/env bash
# Builds lilac with the CUDA backend HERE (no GPU needed) into .device-build/, ready to be
# carried to the GPU machine: binaries with RPATH $ORIGIN/lib, and beside them in lib/ the Debian
# shared libraries the GPU machine's image lacks (ldd lists them; glibc/libstdc++ come from there).
set -euo pipefail
cd "$(dirname "$0")/.."
out=.device-build
cmake -S . -B build/device -G Ninja -DCMAKE_BUILD_TYPE=Release -DLILAC_CUDA=ON -DLILAC_CUDA_PTX=OFF -DLILAC_WERROR=ON >/dev/null
cmake --build build/device -j "$(nproc)" --target lilac lilac_cuda_tests tokenizer_bench grammar_mask_bench $(ninja -C build/device -t targets all 2>/dev/null | grep -o "^lilac_cuda_bench_[a-z0-9_]*" | sort -u) "$@"
rm -rf "$out" && mkdir -p "$out/lib"
for t in lilac lilac_cuda_tests tokenizer_bench grammar_mask_bench $(cd build/device && ls -d lilac_cuda_bench_* 2>/dev/null); do
  [ -f "build/device/$t" ] && cp "build/device/$t" "$out/"
done
# Shared libraries to carry: everything ldd resolves except the C/C++ runtime and the driver.
for bin in "$out"/lilac* "$out"/tokenizer_bench "$out"/grammar_mask_bench; do
  ldd "$bin" | awk '/=> \//{print $3}' | grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*)\.so' | { grep -v "$PWD/$out/" || true; } |
    while read -r lib; do cp -Lu "$lib" "$out/lib/"; done
done
strip "$out"/lilac* "$out"/tokenizer_bench "$out"/grammar_mask_bench
du -sh "$out"
# The device tool carries at most 64 MiB with the working tree: ship the folder compressed
# (tools/gpu-check.sh unpacks it when the folder itself is not there).
tar -C . -cJf .device-build.tar.xz "$out"
du -sh .device-build.tar.xz
