# Sourced at the start of a command on the GPU machine (the device tool's `run`, with `.gpu`
# carried): installs the service's packages that machine lacks from .gpu/whl into /tmp/site and
# puts the carried redis-server (.gpu/bin) on PATH. Make .gpu here with scripts/gpu_pack.sh.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || return 1
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PATH="$PWD/.gpu/bin:$PATH" PYTHONUNBUFFERED=1
