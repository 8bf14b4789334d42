#!/usr/bin/env bash
# Packs what the GPU machine (torch 2.11, no network, no redis-server) needs to run the whole
# stack: wheels of the service's packages it lacks (Python 3.12) and Debian's redis-server with
# its less common libraries. Run here, then carry `.gpu` and `source scripts/gpu_env.sh` there.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/whl .gpu/bin .gpu/lib
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu/whl fastapi "celery[redis]" uvicorn pydantic pydantic-settings redis tenacity cryptography
# already on the GPU machine's image (its package list): keep one version of each
(cd .gpu/whl && rm -f anyio-* click-8* h11-* idna-* packaging-* python_dateutil-* six-* typing_extensions-* annotated_doc-*)
cp "$(readlink -f "$(command -v redis-server)")" .gpu/bin/redis-server.bin
for lib in libatomic.so.1 liblzf.so.1 libjemalloc.so.2; do cp -L "/lib/x86_64-linux-gnu/$lib" .gpu/lib/; done
cat > .gpu/bin/redis-server <<'SH'
#!/bin/sh
here=$(dirname "$(readlink -f "$0")")
LD_LIBRARY_PATH="$here/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/redis-server.bin" "$@"
SH
chmod +x .gpu/bin/redis-server
du -sh .gpu
