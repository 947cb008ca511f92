"""A SharingPolicy's ``gpuSelector``: CEL evaluated over a GPU exactly as a DeviceClass
selector sees the device Tessera publishes for it.

The expression sees ``device.driver``, ``device.attributes[domain].name`` and
``device.capacity[domain].name`` built from ``tessera.models.attributes`` (one source for the
publisher and the planner). Attributes of the ``version`` kind are semantic versions and
capacities are quantities, with the methods of Kubernetes' CEL libraries:
``quantity("40Gi")``, ``isQuantity``, ``compareTo``, ``isGreaterThan``, ``isLessThan``,
``add``, ``sub``, ``sign``, ``isInteger``, ``asInteger``, ``asApproximateFloat``; and
``semver("580.0.0")``, ``isSemver``, ``major``, ``minor``, ``patch`` plus the comparisons.

An expression is compiled once (a bounded cache keyed by its text) and its evaluation is
memoised, so a fleet of identical GPUs costs one evaluation per distinct GPU kind, not one per
GPU, and not one per node reconcile. The memo key is what the expression can read of the
device: ``reads_of`` follows ``device`` through the expression's tokens and proves that it
reads only attributes and capacities named by literals (``device.attributes["<domain>"].<name>``
or ``["<domain>"]["<name>"]``); then only those entries key the memo. An expression it cannot
prove (a computed name such as ``["product" + "Name"]``, a domain's map walked by a macro,
``device`` passed whole) is keyed on the whole device: always right, memoised less.
Not for: admission checks of the expression (the apiserver has no CEL for our selector; bad
expressions surface here as a :class:`GpuSelectorError`, which the operator reports).
"""

from __future__ import annotations

import contextvars
import functools
import importlib.machinery
import importlib.util
import re
import sys
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tessera import DRIVER_NAME
from tessera.models.attributes import MEMORY_CAPACITY, PCIE_ROOT_ATTRIBUTE, whole_gpu_attributes
from tessera.models.layout import GpuStatus
from tessera.models.quantity import MIB
from tessera.models.quantity import quantity_value as parse_kube_quantity


def _cel_evaluator() -> ModuleType:
    """The compiled CEL evaluator of ``common-expression-language``, loaded without its
    package: the package's ``__init__`` also imports its interactive CLI (prompt_toolkit,
    typer, rich), about 25 MiB and 0.6 s that every operator process would carry unused.
    Falls back to the package where the evaluator is not a file beside it."""
    spec = importlib.util.find_spec("cel")  # finds the package without running it
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = Path(folder) / f"cel{suffix}"
            if path.is_file():
                loader = importlib.machinery.ExtensionFileLoader("cel.cel", str(path))
                found = importlib.util.spec_from_file_location("cel.cel", path, loader=loader)
                if found is None:
                    continue
                module = importlib.util.module_from_spec(found)
                loader.exec_module(module)
                sys.modules["cel.cel"] = module  # the package, if anyone imports it, reuses it
                return module
    return importlib.import_module("cel")


if TYPE_CHECKING:
    import cel
else:
    cel = sys.modules.get("cel.cel") or _cel_evaluator()

_QUANTITY_TAG = "__quantity__"
_SEMVER_TAG = "__semver__"

# qualified name -> the attribute or capacity in its hashable wire form, e.g. ("string", "x").
FlatDevice = dict[str, tuple[str, Hashable]]
_CAPACITY = "capacity/"
_MEMORY = f"{_CAPACITY}{DRIVER_NAME}/{MEMORY_CAPACITY}"

# CEL's lexical pieces, enough to follow ``device`` through an expression that compiled:
# comments and spaces, strings in every quoting (only plain ones without escapes are read as
# names), numbers, identifiers, ``.?`` (optional selection) and any other single character.
_TOKEN = re.compile(
    r"(?P<space>\s+|//[^\n]*)"
    r"|(?P<string>[rRbB]{0,2}(?:'''[\s\S]*?'''|\"\"\"[\s\S]*?\"\"\"|'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\"))"
    r"|(?P<number>[0-9][0-9A-Za-z_.]*)"
    r"|(?P<ident>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<other>\.\?|.)"
)
_PLAIN_STRING = re.compile(r"\"([^\"\\]*)\"|'([^'\\]*)'")
ReadSet = frozenset[tuple[str, str, str]]  # ("attributes" | "capacity", domain, name)


_MEMO_LIMIT = 65_536


class GpuSelectorError(ValueError):
    """The expression does not parse, fails on a GPU, or does not give true or false."""


# ---------------------------------------------------------------- quantities and versions

_SEMVER_RE = re.compile(
    r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$"
)

_misuse: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("tessera_cel_misuse", default=None)


def _fail(message: str) -> None:
    """Record why a library function refused its arguments; it then returns null.

    Raising inside a CEL callback makes the CEL runtime print to stderr; returning null and
    reporting the recorded message keeps the error clear and the output clean."""
    errors = _misuse.get()
    if errors is not None:
        errors.append(message)


def parse_cel_quantity(text: str) -> Fraction | None:
    """The exact value of a Kubernetes quantity string, or None when it is not one."""
    try:
        return parse_kube_quantity(text)
    except ValueError:
        return None


def quantity_value(value: Fraction) -> dict[str, str]:
    """A quantity as the CEL runtime carries it: a tagged map, equal when the values are."""
    return {_QUANTITY_TAG: str(value)}


def _as_quantity(value: Any) -> Fraction | None:
    if isinstance(value, dict) and _QUANTITY_TAG in value:
        return Fraction(value[_QUANTITY_TAG])
    return None


def _semver_value(text: str) -> dict[str, str]:
    return {_SEMVER_TAG: text}


def _as_semver(value: Any) -> tuple[int, int, int, bool, str] | None:
    if not (isinstance(value, dict) and _SEMVER_TAG in value):
        return None
    match = _SEMVER_RE.match(value[_SEMVER_TAG])
    if match is None:
        return None
    major, minor, patch, pre = match.groups()
    return (int(major), int(minor), int(patch), pre is None, pre or "")


def _quantity(text: Any) -> dict[str, str] | None:
    parsed = parse_cel_quantity(text) if isinstance(text, str) else None
    if parsed is None:
        _fail(f"quantity({text!r}): not a quantity; write it like 40Gi, 512Mi or 10G")
        return None
    return quantity_value(parsed)


def _is_quantity(text: Any) -> bool:
    return isinstance(text, str) and parse_cel_quantity(text) is not None


def _semver(text: Any) -> dict[str, str] | None:
    if not isinstance(text, str) or _SEMVER_RE.match(text) is None:
        _fail(f"semver({text!r}): not a semantic version; write it like 1.2.3")
        return None
    return _semver_value(text)


def _is_semver(text: Any) -> bool:
    return isinstance(text, str) and _SEMVER_RE.match(text) is not None


def _compare(name: str, left: Any, right: Any) -> int | None:
    lq, rq = _as_quantity(left), _as_quantity(right)
    if lq is not None and rq is not None:
        return (lq > rq) - (lq < rq)
    ls, rs = _as_semver(left), _as_semver(right)
    if ls is not None and rs is not None:
        return (ls > rs) - (ls < rs)
    _fail(
        f"{name}() compares two quantities or two semantic versions, e.g. "
        f'x.{name}(quantity("40Gi")) or x.{name}(semver("1.2.3"))'
    )
    return None


def _compare_to(left: Any, right: Any) -> int | None:
    return _compare("compareTo", left, right)


def _is_greater_than(left: Any, right: Any) -> bool | None:
    result = _compare("isGreaterThan", left, right)
    return None if result is None else result > 0


def _is_less_than(left: Any, right: Any) -> bool | None:
    result = _compare("isLessThan", left, right)
    return None if result is None else result < 0


def _quantity_operand(name: str, value: Any) -> Fraction | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return Fraction(value)
    parsed = _as_quantity(value)
    if parsed is None:
        _fail(f"{name}() takes a quantity or an integer")
    return parsed


def _add(left: Any, right: Any) -> dict[str, str] | None:
    lq, rq = _quantity_operand("add", left), _quantity_operand("add", right)
    return None if lq is None or rq is None else quantity_value(lq + rq)


def _sub(left: Any, right: Any) -> dict[str, str] | None:
    lq, rq = _quantity_operand("sub", left), _quantity_operand("sub", right)
    return None if lq is None or rq is None else quantity_value(lq - rq)


def _quantity_method(name: str, convert: Callable[[Fraction], Any]) -> Callable[[Any], Any]:
    def method(value: Any) -> Any:
        parsed = _as_quantity(value)
        if parsed is None:
            _fail(f"{name}() is a method of quantities")
            return None
        return convert(parsed)

    method.__name__ = name
    return method


def _as_integer(value: Fraction) -> int | None:
    if value.denominator != 1 or not -(2**63) <= value.numerator < 2**63:
        _fail(f"asInteger(): {float(value)} is not an integer that fits in 64 bits")
        return None
    return value.numerator


def _semver_part(name: str, index: int) -> Callable[[Any], int | None]:
    def method(value: Any) -> int | None:
        parsed = _as_semver(value)
        if parsed is None:
            _fail(f"{name}() is a method of semantic versions")
            return None
        major, minor, patch = parsed[:3]
        return (major, minor, patch)[index]

    method.__name__ = name
    return method


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "semver": _semver,
    "isSemver": _is_semver,
    "compareTo": _compare_to,
    "isGreaterThan": _is_greater_than,
    "isLessThan": _is_less_than,
    "add": _add,
    "sub": _sub,
    "sign": _quantity_method("sign", lambda q: (q > 0) - (q < 0)),
    "isInteger": _quantity_method("isInteger", lambda q: q.denominator == 1 and -(2**63) <= q < 2**63),
    "asInteger": _quantity_method("asInteger", _as_integer),
    "asApproximateFloat": _quantity_method("asApproximateFloat", float),
    "major": _semver_part("major", 0),
    "minor": _semver_part("minor", 1),
    "patch": _semver_part("patch", 2),
}


# ---------------------------------------------------------------- the device a selector sees


def flat_device(gpu: GpuStatus) -> FlatDevice:
    """The published whole-GPU device of ``gpu`` as ``qualified name -> (wire type, value)``;
    attributes keep their names (``productName``, ``resource.kubernetes.io/pcieRoot``),
    capacities are under ``capacity/<domain>/<name>``."""
    flat: FlatDevice = {name: next(iter(value.items())) for name, value in whole_gpu_attributes(gpu).items()}
    flat[_MEMORY] = ("quantity", gpu.memory_mib * MIB)
    return flat


def _entry(qualified: str) -> tuple[str, str, str]:
    """Where a ``FlatDevice`` entry sits in the CEL device: (kind, domain, name)."""
    kind = "attributes"
    if qualified.startswith(_CAPACITY):
        kind, qualified = "capacity", qualified.removeprefix(_CAPACITY)
    domain, _, name = qualified.rpartition("/")
    return kind, domain or DRIVER_NAME, name


def _literal(token: tuple[str, str]) -> str | None:
    """The text of a plain string literal (no escapes, prefixes or triple quotes), else None."""
    if token[0] != "string":
        return None
    match = _PLAIN_STRING.fullmatch(token[1])
    if match is None:
        return None
    return match.group(1) if match.group(1) is not None else match.group(2)


def reads_of(source: str) -> ReadSet | None:
    """The attributes and capacities ``source`` can read of ``device``, or None when that cannot
    be proved from its tokens (then any entry of the device may matter).

    Every ``device`` that is not a field of something else (``x.device``) must be followed by
    ``.driver``, ``.allowMultipleAllocations`` (the same for every device), or
    ``.attributes`` / ``.capacity``, a literal domain in brackets, and a name: ``.<name>``
    not called as a method, or a literal in brackets. Anything else reads what no literal
    names."""
    tokens = [(m.lastgroup or "other", m.group()) for m in _TOKEN.finditer(source) if m.lastgroup != "space"]

    def at(i: int) -> tuple[str, str]:
        return tokens[i] if 0 <= i < len(tokens) else ("end", "")

    reads: set[tuple[str, str, str]] = set()
    for i, token in enumerate(tokens):
        if token != ("ident", "device") or at(i - 1)[1] in (".", ".?"):
            continue
        if at(i + 1)[1] != "." or at(i + 2)[0] != "ident":
            return None  # device used whole, indexed, or selected optionally
        part = at(i + 2)[1]
        if part in ("driver", "allowMultipleAllocations"):
            continue
        if part not in ("attributes", "capacity"):
            return None
        domain = _literal(at(i + 4)) if at(i + 3)[1] == "[" and at(i + 5)[1] == "]" else None
        name: str | None = None
        if at(i + 6)[1] == "." and at(i + 7)[0] == "ident" and at(i + 8)[1] != "(":
            name = at(i + 7)[1]
        elif at(i + 6)[1] == "[" and at(i + 8)[1] == "]":
            name = _literal(at(i + 7))
        if domain is None or name is None:
            return None  # a computed domain or name, or a domain's map walked, sized or passed on
        reads.add((part, domain, name))
    return frozenset(reads)


def flat_published_device(device: Mapping[str, Any]) -> FlatDevice:
    """A device in the ``resource.k8s.io/v1`` wire shape (as ``tessera.dra.devices`` builds it
    for a slice) in the form :meth:`CompiledGpuSelector.matches` reads, so a claim's or a
    DeviceClass's selector runs on the CEL path a ``gpuSelector`` does. Attributes keep their
    names; each capacity becomes ``capacity/<domain>/<name>``, a quantity."""
    flat: FlatDevice = {}
    for name, value in device.get("attributes", {}).items():
        wire_type, wire_value = next(iter(value.items()))
        flat[name] = (wire_type, wire_value)
    for name, value in device.get("capacity", {}).items():
        qualified = name if "/" in name else f"{DRIVER_NAME}/{name}"
        flat[f"{_CAPACITY}{qualified}"] = ("quantity", str(parse_kube_quantity(str(value["value"]))))
    return flat


def _cel_device(flat: FlatDevice) -> dict[str, Any]:
    device: dict[str, Any] = {
        "driver": DRIVER_NAME,
        "allowMultipleAllocations": False,
        # As in Kubernetes, a standard domain with nothing in it is an empty map, so
        # has(device.attributes["resource.kubernetes.io"].pcieRoot) is false, not an error.
        "attributes": {DRIVER_NAME: {}, PCIE_ROOT_ATTRIBUTE.partition("/")[0]: {}},
        "capacity": {DRIVER_NAME: {}},
    }
    for qualified, (wire_type, wire_value) in flat.items():
        kind, domain, name = _entry(qualified)
        if wire_type == "version":
            value: Any = _semver_value(str(wire_value))
        elif wire_type == "quantity":
            value = quantity_value(Fraction(str(wire_value)))
        else:
            value = wire_value
        device[kind].setdefault(domain, {})[name] = value
    return device


@dataclass
class CompiledGpuSelector:
    """A compiled ``gpuSelector``; :meth:`matches` says whether a GPU is selected."""

    source: str
    _program: cel.Program = field(repr=False)
    _reads: ReadSet | None = field(repr=False)  # None: not proved, the whole device keys the memo
    _memo: dict[tuple[Hashable, ...], bool | str] = field(default_factory=dict, repr=False)
    _relevant: dict[str, bool] = field(default_factory=dict, repr=False)

    def _key(self, flat: FlatDevice) -> tuple[Hashable, ...]:
        """What the expression can read of ``flat``. Insertion order is the publisher's
        fixed order, so equal devices give equal keys."""
        if self._reads is None:
            return tuple(flat.items())
        relevant = self._relevant
        key = []
        for item in flat.items():
            wanted = relevant.get(item[0])
            if wanted is None:
                wanted = relevant[item[0]] = _entry(item[0]) in self._reads
            if wanted:
                key.append(item)
        return tuple(key)

    def matches(self, gpu: GpuStatus, flat: FlatDevice | None = None) -> bool:
        """True when the expression selects ``gpu``; a :class:`GpuSelectorError` when it fails
        on it (a missing attribute, a type error) or does not give a bool. ``flat`` is
        :func:`flat_device` of ``gpu`` when the caller already has it."""
        return self.matches_flat(flat if flat is not None else flat_device(gpu))

    def matches_flat(self, flat: FlatDevice) -> bool:
        """:meth:`matches` on a device already in its flat form: a GPU's (:func:`flat_device`)
        or any published device's (:func:`flat_published_device`)."""
        key = self._key(flat)
        verdict = self._memo.get(key)
        if verdict is None:
            verdict = self._evaluate(flat)
            if len(self._memo) >= _MEMO_LIMIT:
                self._memo.clear()
            self._memo[key] = verdict
        if isinstance(verdict, str):
            raise GpuSelectorError(verdict)
        return verdict

    def _evaluate(self, flat: FlatDevice) -> bool | str:
        errors: list[str] = []
        token = _misuse.set(errors)
        try:
            context = cel.Context(variables={"device": _cel_device(flat)}, functions=FUNCTIONS)
            result = self._program.execute(context)
        except (ValueError, TypeError, KeyError, RuntimeError) as exc:
            return _runtime_message(self.source, errors, exc)
        finally:
            _misuse.reset(token)
        if errors:
            return f"gpuSelector {self.source!r}: {errors[0]}"
        if not isinstance(result, bool):
            return f"gpuSelector {self.source!r} must give true or false, not {type(result).__name__} {result!r}"
        return result


def _runtime_message(source: str, errors: list[str], exc: Exception) -> str:
    if errors:
        return f"gpuSelector {source!r}: {errors[0]}"
    if isinstance(exc, KeyError):
        return (
            f"gpuSelector {source!r}: the device has no {exc.args[0]!r}; published GPUs carry "
            'device.attributes["gpu.tessera.dev"].<name> and device.capacity["gpu.tessera.dev"].memory '
            "(test optional ones with has(...))"
        )
    text = str(exc).split(". Check", 1)[0].split(". CEL does not coerce", 1)[0]
    return f"gpuSelector {source!r}: {text}"


def _parse_detail(text: str) -> str:
    """One line from the parser's report: ``at column 19: mismatched input ...``."""
    found = re.findall(r"ERROR: <input>:(\d+):(\d+): (.*)", text)
    if not found:
        return text.strip().splitlines()[0] if text.strip() else "syntax error"
    syntax = [f for f in found if f[2].startswith("Syntax error")] or found
    line, column, message = syntax[-1]
    message = message.removeprefix("Syntax error: ")
    where = f"column {column}" if line == "1" else f"line {line}, column {column}"
    return f"at {where}: {message}"


_COMPILED_LIMIT = 256  # distinct expressions kept compiled; a cluster has a handful of policies


@functools.lru_cache(maxsize=_COMPILED_LIMIT)
def _compile(source: str) -> CompiledGpuSelector | GpuSelectorError:
    try:
        program = cel.compile(source)
    except (ValueError, RuntimeError) as exc:
        return GpuSelectorError(f"gpuSelector {source!r} does not parse: {_parse_detail(str(exc))}")
    return CompiledGpuSelector(source, program, reads_of(source))


def compile_gpu_selector(source: str) -> CompiledGpuSelector:
    """Compile a ``gpuSelector.cel`` expression, or a :class:`GpuSelectorError` that says
    where it does not parse.

    Compiled once per expression (the last 256 distinct ones are kept, and so are parse
    errors): every node reconcile gets the same selector back, with its memo of verdicts."""
    compiled = _compile(source)
    if isinstance(compiled, GpuSelectorError):
        raise GpuSelectorError(str(compiled))
    return compiled


def forget_compiled_selectors() -> None:
    """Drop every compiled selector and its memo (benchmarks measure the cold cost with it)."""
    _compile.cache_clear()
