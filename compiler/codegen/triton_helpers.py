"""Helper @triton.jit functions that generated kernels include when they use them:
combine functions for reductions, and tl.math-only versions of libdevice functions
for Triton's interpreter (which implements tl.math but not libdevice)."""

HELPERS = {
    "max": '''@triton.jit
def _fw_max_combine(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)  # one max.NaN instruction, NaN wins like torch
''',
    "min": '''@triton.jit
def _fw_min_combine(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
''',
    "prod": '''@triton.jit
def _fw_prod_combine(a, b):
    return a * b
''',
    "argmax": '''@triton.jit
def _fw_argmax_combine(value_a, index_a, value_b, index_b):
    nan_a = value_a != value_a
    nan_b = value_b != value_b
    take_a = (value_a > value_b) | (nan_a & ~nan_b) | ((value_a == value_b) | (nan_a & nan_b)) & (index_a < index_b)
    return tl.where(take_a, value_a, value_b), tl.where(take_a, index_a, index_b)
''',
    "argmin": '''@triton.jit
def _fw_argmin_combine(value_a, index_a, value_b, index_b):
    nan_a = value_a != value_a
    nan_b = value_b != value_b
    take_a = (value_a < value_b) | (nan_a & ~nan_b) | ((value_a == value_b) | (nan_a & nan_b)) & (index_a < index_b)
    return tl.where(take_a, value_a, value_b), tl.where(take_a, index_a, index_b)
''',
    # Chan's pairwise update: how a GPU joins a looped Welford reduction's lanes (codegen.kernel.WELFORD_LANES_BY_SUMS)
    "welford": '''@triton.jit
def _fw_welford_combine(mean_a, m2_a, weight_a, mean_b, m2_b, weight_b):
    weight = weight_a + weight_b
    delta = mean_b - mean_a
    fraction = tl.where(weight == 0.0, 0.0, weight_b / tl.where(weight == 0.0, 1.0, weight))
    return mean_a + delta * fraction, m2_a + m2_b + delta * delta * weight_a * fraction, weight
''',
}


# Triton's interpreter implements tl.math but not libdevice, so kernels for the "cpu"
# target compute these functions from tl.math primitives; cuda targets call libdevice.
PORTABLE_MATH = {
    "tanh": """@triton.jit
def _fw_tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0
""",
    "log1p": """@triton.jit
def _fw_log1p(x):
    u = 1.0 + x
    finite = (u != 1.0) & (u != float("inf"))
    return tl.where(finite, tl.log(u) * (x / tl.where(finite, u - 1.0, 1.0)), tl.where(u == 1.0, x, u))
""",
    "expm1": """@triton.jit
def _fw_expm1(x):
    u = tl.exp(x)
    special = (u == 1.0) | (u == 0.0) | (u == float("inf"))
    safe = tl.where(special, 2.0, u)
    return tl.where(special, tl.where(u == 1.0, x, u - 1.0), (safe - 1.0) * (x / tl.log(safe)))
""",
    "trunc": """@triton.jit
def _fw_trunc(x):
    return tl.where(x >= 0, tl.floor(x), tl.ceil(x))
""",
    "nearbyint": """@triton.jit
def _fw_nearbyint(x):
    # x - floor(x) is exact (x + 0.5 is not: it rounds for |x| >= 2**23 and just below 0.5)
    f = tl.floor(x)
    d = x - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0
    return tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)
""",
    "pow": """@triton.jit
def _fw_pow(a, b):
    magnitude = tl.exp(b * tl.log(tl.abs(a)))
    integral = b == tl.floor(b)
    odd = integral & ((b - 2.0 * tl.floor(b * 0.5)) != 0)
    signed = tl.where(odd, -magnitude, magnitude)
    result = tl.where(a < 0, tl.where(integral, signed, float("nan")), magnitude)
    return tl.where(b == 0, 1.0, result)
""",
    "fmod": """@triton.jit
def _fw_fmod(a, b):
    q = a / b
    return a - tl.where(q >= 0, tl.floor(q), tl.ceil(q)) * b
""",
    "sinh": """@triton.jit
def _fw_sinh(x):
    return 0.5 * (tl.exp(x) - tl.exp(-x))
""",
    "cosh": """@triton.jit
def _fw_cosh(x):
    return 0.5 * (tl.exp(x) + tl.exp(-x))
""",
    "tan": """@triton.jit
def _fw_tan(x):
    return tl.sin(x) / tl.cos(x)
""",
    "atan": """@triton.jit
def _fw_atan(x):
    # Cephes atanf: reduce |x| to [0, tan(pi/8)], then a degree-9 odd polynomial
    a = tl.abs(x)
    big = a > 2.414213562373095
    mid = a > 0.41421356237309503
    base = tl.where(big, 1.5707963267948966, tl.where(mid, 0.7853981633974483, 0.0))
    t = tl.where(big, -1.0 / tl.where(big, a, 1.0), tl.where(mid, (a - 1.0) / (a + 1.0), a))
    z = t * t
    p = (((0.0805374449538 * z - 0.138776856032) * z + 0.199777106478) * z - 0.333329491539) * z * t + t
    return tl.where(x < 0, -(base + p), base + p)
""",
    "atan2": """@triton.jit
def _fw_atan2(y, x):
    ax = tl.abs(x)
    ay = tl.abs(y)
    hi = tl.maximum(ax, ay)
    t = tl.minimum(ax, ay) / tl.where(hi == 0.0, 1.0, hi)
    mid = t > 0.41421356237309503
    u = tl.where(mid, (t - 1.0) / (t + 1.0), t)
    z = u * u
    p = (((0.0805374449538 * z - 0.138776856032) * z + 0.199777106478) * z - 0.333329491539) * z * u + u
    r = tl.where(mid, 0.7853981633974483 + p, p)
    r = tl.where((ax == float("inf")) & (ay == float("inf")), 0.7853981633974483, r)
    r = tl.where(ay > ax, 1.5707963267948966 - r, r)
    # signs as atan2 reads them: -0.0 counts as negative (1 / -0.0 == -inf)
    negative_x = (x < 0) | ((x == 0) & (1.0 / tl.where(x == 0, x, 1.0) < 0))
    negative_y = (y < 0) | ((y == 0) & (1.0 / tl.where(y == 0, y, 1.0) < 0))
    r = tl.where(negative_x, 3.141592653589793 - r, r)
    return tl.where((x != x) | (y != y), x + y, tl.where(negative_y, -r, r))
""",
    "round_to_bf16": """@triton.jit
def _fw_round_to_bf16(x):
    # the interpreter truncates float32 -> bfloat16; round to nearest even first, as the GPU does
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
    return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))
""",
}
