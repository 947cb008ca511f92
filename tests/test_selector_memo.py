"""The gpuSelector memo cannot lie: its key is what the expression can read of the device
(``reads_of`` proves it from the tokens), or the whole device when that cannot be proved. A
property test compares memoised answers with fresh evaluations on generated expressions and
devices, including computed attribute names that a key from the source text's words got wrong."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tessera import DRIVER_NAME
from tessera.planner.selector import FlatDevice, GpuSelectorError, compile_gpu_selector, reads_of

A = f'device.attributes["{DRIVER_NAME}"]'
PCIE = "resource.kubernetes.io/pcieRoot"


def device(product: str, **extra: tuple[str, object]) -> FlatDevice:
    flat: FlatDevice = {"productName": ("string", product), "index": ("int", 0)}
    flat.update(extra)
    return flat


def answer(selector_source: str, flat: FlatDevice, *, fresh: bool) -> bool | str:
    selector = compile_gpu_selector(selector_source)
    try:
        return selector._evaluate(flat) if fresh else selector.matches_flat(flat)
    except GpuSelectorError as error:
        return str(error)


def test_reads_are_proved_for_literal_names_and_refused_for_anything_computed() -> None:
    assert reads_of(f'{A}.productName == "x" && device.capacity["{DRIVER_NAME}"]["memory"].sign() > 0') == {
        ("attributes", DRIVER_NAME, "productName"), ("capacity", DRIVER_NAME, "memory")}
    assert reads_of('has(device.attributes["resource.kubernetes.io"].pcieRoot) && device.driver != ""') == {
        ("attributes", "resource.kubernetes.io", "pcieRoot")}
    assert reads_of('"device.attributes" == "device" || 1 == 1') == frozenset(), "words inside strings read nothing"
    for unprovable in (
        f'{A}["product" + "Name"] == "x"',
        'device.attributes["gpu.tessera" + ".dev"].productName == "x"',
        f'{A}.exists(name, name == "model")',
        f"size({A}) > 2",
        'device.attributes["gpu.tessera.dev"].?productName.orValue("") == "x"',
        'device["attributes"]["gpu.tessera.dev"].productName == "x"',
        f'{A}["product\\u004eame"] == "x"',
    ):
        assert reads_of(unprovable) is None, unprovable


def test_a_computed_attribute_name_gets_a_verdict_per_gpu_not_one_for_all() -> None:
    source = f'{A}["product" + "Name"].startsWith("NVIDIA H100")'
    h100, a100 = device("NVIDIA H100 80GB HBM3"), device("NVIDIA A100-SXM4-80GB")
    assert answer(source, h100, fresh=False) is True
    assert answer(source, a100, fresh=False) is False, "the memo must not hand the H100's answer to the A100"


NAMES = ("productName", "model", "index")
VALUES = {"productName": st.sampled_from(["NVIDIA H100", "NVIDIA A100", "NVIDIA L4"]),
          "model": st.sampled_from(["H100-80GB", "A100-80GB"]), "index": st.integers(0, 3)}


@st.composite
def devices(draw: st.DrawFn) -> FlatDevice:
    flat: FlatDevice = {}
    for name in NAMES:
        if draw(st.booleans()) or name == "productName":
            value = draw(VALUES[name])
            flat[name] = ("int" if isinstance(value, int) else "string", value)
    if draw(st.booleans()):
        flat[PCIE] = ("string", draw(st.sampled_from(["pci0000:00", "pci0000:80"])))
    flat[f"capacity/{DRIVER_NAME}/memory"] = ("quantity", draw(st.sampled_from([40 * 2**30, 80 * 2**30])))
    return flat


def _split(name: str, cut: int) -> str:
    return f'"{name[:cut]}" + "{name[cut:]}"'


@st.composite
def atoms(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(NAMES))
    value = "1" if name == "index" else f'"{draw(VALUES[name])}"'
    cut = draw(st.integers(1, len(name) - 1))
    return draw(st.sampled_from([
        f"{A}.{name} == {value}",
        f'{A}["{name}"] == {value}',
        f"{A}[{_split(name, cut)}] == {value}",
        f'device.attributes["gpu.tessera" + ".dev"].{name} == {value}',
        f"has({A}.{name})",
        f'{A}.exists(k, k == "{name}")',
        f"size({A}) > {draw(st.integers(1, 4))}",
        'has(device.attributes["resource.kubernetes.io"].pcieRoot)',
        f'device.capacity["{DRIVER_NAME}"].memory.isGreaterThan(quantity("50Gi"))',
        f'device.driver == "{DRIVER_NAME}"',
        f'"{name}" == "device.attributes"',
    ]))


expressions = st.recursive(
    atoms(),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["&&", "||"]), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        inner.map(lambda e: f"!({e})"),
        st.tuples(inner, inner, inner).map(lambda t: f"({t[0]} ? {t[1]} : {t[2]})"),
    ),
    max_leaves=4,
)


@settings(max_examples=300, deadline=None)
@given(source=expressions, fleet=st.lists(devices(), min_size=1, max_size=6))
def test_memoised_answers_equal_fresh_ones(source: str, fleet: list[FlatDevice]) -> None:
    for flat in fleet:
        assert answer(source, flat, fresh=False) == answer(source, flat, fresh=True), (source, flat)
