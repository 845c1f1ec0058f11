"""The native kernels' ABI in one place: native.h's prototypes and structs against native.py's ctypes mirror (types,
field order, offsets, sizes as the C compiler lays them out), native.c built with warnings as errors, and the
native kernel tests run once against a build under AddressSanitizer and UndefinedBehaviorSanitizer."""

from __future__ import annotations

import ctypes
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inferfleet_runtime.kernels import native

COMPILER = os.environ.get("CC") or "cc"
pytestmark = pytest.mark.skipif(shutil.which(COMPILER) is None, reason=f"no C compiler ({COMPILER}) here")

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
C_SCALARS = {"int64_t": ctypes.c_int64, "int": ctypes.c_int, "float": ctypes.c_float}
STRUCTS = {"inferfleet_qweight": native._QWeight, "inferfleet_layer": native._Layer, "inferfleet_model": native._Model}


def header() -> str:
    text = native.HEADER.read_text()
    return re.sub(r"/\*.*?\*/", " ", text, flags=re.S)  # comments out


def c_type(declaration: str):
    """ctypes kind of a C declaration's type: 'pointer', a ctypes scalar, or None (void)."""
    if "*" in declaration:
        return "pointer"
    words = declaration.replace("const", " ").split()
    return None if words == ["void"] else C_SCALARS[words[0]]


def ctypes_kind(t):
    if t is ctypes.c_void_p or (isinstance(t, type) and issubclass(t, ctypes._Pointer)):
        return "pointer"
    return t


def prototypes() -> dict[str, tuple]:
    found = {}
    for ret, name, args in re.findall(r"(\w+)\s+(inferfleet_\w+)\s*\(([^)]*)\);", " ".join(header().split())):
        params = [] if args.strip() == "void" else [c_type(re.sub(r"\w+$", "", a.strip())) for a in args.split(",")]
        found[name] = (c_type(ret), params)
    return found


def struct_fields(name: str) -> list[tuple[str, object]]:
    body = re.search(r"typedef struct \{([^}]*)\}\s*" + name + ";", header()).group(1)
    fields = []
    for declaration in filter(None, (d.strip() for d in body.split(";"))):
        base = re.match(r"((?:const\s+)?\w+)\s+", declaration).group(1)
        for declarator in declaration[len(base) :].split(","):
            field = declarator.strip()
            fields.append((field.lstrip("*").strip(), "pointer" if field.startswith("*") else c_type(base)))
    return fields


def test_every_exported_function_has_one_prototype_and_the_same_types_in_native_py():
    declared = prototypes()
    assert set(declared) == set(native.SIGNATURES)
    for name, (restype, argtypes) in native.SIGNATURES.items():
        c_ret, c_args = declared[name]
        assert ctypes_kind(restype) == c_ret, name
        assert [ctypes_kind(t) for t in argtypes] == c_args, name


def test_every_struct_has_native_pys_fields_in_order_at_the_c_compilers_offsets(tmp_path):
    lines = ["#include <stddef.h>", "#include <stdio.h>", f'#include "{native.HEADER}"', "int main(void) {"]
    for struct, mirror in STRUCTS.items():
        fields = struct_fields(struct)
        assert [(n, ctypes_kind(t)) for n, t in mirror._fields_] == fields, struct
        lines.append(f'printf("{struct} size %zu\\n", sizeof({struct}));')
        lines += [f'printf("{struct} {n} %zu\\n", offsetof({struct}, {n}));' for n, _ in fields]
    program = tmp_path / "layout.c"
    program.write_text("\n".join([*lines, "return 0; }"]))
    built = subprocess.run([COMPILER, "-o", str(tmp_path / "layout"), str(program)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    layout = subprocess.run([str(tmp_path / "layout")], capture_output=True, text=True, check=True).stdout
    for line in layout.splitlines():
        struct, field, value = line.split()
        mirror = STRUCTS[struct]
        expected = ctypes.sizeof(mirror) if field == "size" else getattr(mirror, field).offset
        assert int(value) == expected, f"{struct}.{field}: C {value}, ctypes {expected}"


def test_native_c_builds_with_warnings_as_errors(tmp_path):
    built = subprocess.run(
        [COMPILER, *native.FLAGS, "-Wall", "-Wextra", "-Werror", "-o", str(tmp_path / "native.so"), str(native.SOURCE)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-4000:]


def sanitizer_runtime() -> str | None:
    found = subprocess.run([COMPILER, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    return found if os.path.isabs(found) and os.path.exists(found) else None


@pytest.mark.slow
@pytest.mark.skipif(sanitizer_runtime() is None, reason="the compiler has no AddressSanitizer runtime")
def test_native_kernel_tests_pass_under_address_and_undefined_behaviour_sanitizers(tmp_path):
    library = tmp_path / "native-sanitized.so"
    flags = [f for f in native.FLAGS if f != "-O3"]
    built = subprocess.run(
        [COMPILER, *flags, "-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
         "-fno-sanitize-recover=undefined", "-o", str(library), str(native.SOURCE)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-4000:]
    env = {
        **os.environ,
        "LD_PRELOAD": sanitizer_runtime(),  # the ASan runtime first, before Python and torch load anything
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:exitcode=86",  # the interpreter's own leaks are not ours
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:exitcode=87",
        "INFERFLEET_NATIVE_LIBRARY": str(library),
    }
    tests = [str(HERE / "test_native.py"), str(HERE / "test_native_quantized.py")]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *tests, "-q", "-x", "-s", "-p", "no:cacheprovider", "-m", "not slow"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    output = run.stdout + run.stderr
    assert "AddressSanitizer" not in output and "runtime error:" not in output, output[-6000:]
    assert run.returncode == 0 and " passed" in output, output[-6000:]


def cpu_has(*flags: str) -> bool:
    return set(flags) <= set(native._cpu_flags().split())


# Builds of native.c for each integer dot product its int8-activation matmul has: the ISA flags taken away from
# -march=native, and the CPU flags the build still needs to run here.
DOT_PRODUCT_BUILDS = [
    ("AVX-512BW", ["-mno-avx512vnni"], ["avx512bw"]),
    ("AVX2", ["-mno-avx512f"], ["avx2"]),
    ("plain C", ["-mno-avx2", "-mno-avx512f"], []),
]


def variant_build(tmp_path, flags: list[str], needs: list[str]) -> dict[str, str]:
    """native.c built with ISA flags taken away; the environment that makes a Python process load that build."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the ISA flags are x86's")
    if not cpu_has(*needs):
        pytest.skip(f"this CPU lacks {needs}")
    library = tmp_path / "native-variant.so"
    built = subprocess.run([COMPILER, *native.FLAGS, *flags, "-o", str(library), str(native.SOURCE)],
                           capture_output=True, text=True)  # fmt: skip
    assert built.returncode == 0, built.stderr[-4000:]
    path = os.pathsep.join(filter(None, [str(ROOT / "runtime"), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "INFERFLEET_NATIVE_LIBRARY": str(library), "PYTHONPATH": path}


def run_tests_with(env: dict[str, str], test_file: str, selection: str) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", str(HERE / test_file), "-q", "-x", "-p", "no:cacheprovider", "-k", selection],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0 and " passed" in run.stdout, (run.stdout + run.stderr)[-6000:]


@pytest.mark.slow
@pytest.mark.parametrize("isa,flags,needs", DOT_PRODUCT_BUILDS, ids=[b[0] for b in DOT_PRODUCT_BUILDS])
def test_int8_activation_tests_pass_on_every_dot_product_path(tmp_path, isa, flags, needs):
    env = variant_build(tmp_path, flags, needs)
    check = "from inferfleet_runtime.kernels import native; print(native.qdot_isa())"
    assert subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == isa  # fmt: skip
    run_tests_with(env, "test_native_quantized.py", "int8_activation or many_threads or half_a_byte")


@pytest.mark.slow
@pytest.mark.parametrize("isa,flags,needs", DOT_PRODUCT_BUILDS[1:], ids=[b[0] for b in DOT_PRODUCT_BUILDS[1:]])
def test_attention_and_float_matmul_tests_pass_with_8_float_vectors(tmp_path, isa, flags, needs):
    """Without AVX-512 the vectors hold 8 floats: attention's sum_lanes and the matmul's panels take their
    narrower forms (plain C: whatever the compiler makes of the same vector code)."""
    env = variant_build(tmp_path, flags, needs)
    check = "from inferfleet_runtime.kernels import native; print(native.panel_width())"
    assert subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "16"  # fmt: skip
    run_tests_with(env, "test_native.py", "attention or linear or forward")
