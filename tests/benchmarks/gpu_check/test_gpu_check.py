"""benchmarks/gpu_check (`make gpu-check`): stage isolation and time limits, the report and its
goals, bit comparison, and that every kernel the check compiles on a GPU lowers to Triton for the
"cuda" platform at the check's own shapes (checked here on the CPU).

The whole dry run (`make gpu-check DRY_RUN=1`) runs in tests/reliability/test_stock_environment.py,
in a stock environment (no TFDS, grain, array_record, TensorFlow, tensorboardX).
"""

import doctest
import importlib
import json
import os
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)

from benchmarks.gpu_check import (_data, _record, _report, _runner, bandwidth, gemm,  # noqa: E402
                                  kernels, native, steps)

FAKE_STAGES = {
    "fake_crash": """
        import os
        def run(rec, dry_run):
          rec.figure("before the crash", 1.0)
          os._exit(3)                      # e.g. a segfault in a compiler
        """,
    "fake_hang": """
        import time
        def run(rec, dry_run):
          rec.figure("before the hang", 2.0)
          time.sleep(120)                  # e.g. a kernel that never ends
        """,
    "fake_raise": """
        def run(rec, dry_run):
          raise RuntimeError("RESOURCE_EXHAUSTED: out of memory")
        """,
    "fake_ok": """
        import os
        def run(rec, dry_run):
          rec.check("something", True)
          rec.figure("platforms", os.environ.get("JAX_PLATFORMS"), goal=">= 70%", met=True)
        """,
}


@pytest.fixture
def fake_stages(tmp_path, monkeypatch):
  (tmp_path / "fakes").mkdir()
  (tmp_path / "fakes" / "__init__.py").write_text("")
  for name, body in FAKE_STAGES.items():
    (tmp_path / "fakes" / f"{name}.py").write_text(textwrap.dedent(body))
  monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # child_env puts the repository first
  return lambda name, limit=30: _runner.Stage(name[5], f"fakes.{name}", name, limit)


def test_a_failing_stage_never_stops_the_next(fake_stages, tmp_path, monkeypatch):
  monkeypatch.setattr(_runner, "MIN_STAGE_S", 1.0)  # short deadlines keep this test short
  stages = [fake_stages("fake_crash", limit=5), fake_stages("fake_hang", limit=3),
            fake_stages("fake_raise"), fake_stages("fake_ok")]
  updates = []
  results = _runner.run_all(stages, dry_run=True, workdir=str(tmp_path / "out"),
                            total_limit_s=68, progress=lambda *a, **k: None,
                            on_update=lambda r: updates.append([x["status"] for x in r]))
  crash, hang, raised, ok = results
  assert [r["status"] for r in results] == ["fail", "fail", "fail", "pass"]
  assert "code 3" in crash["error"] and crash["figures"][0]["value"] == 1.0  # kept
  # killed at its deadline: its own 3 s and what the crash left of its 5 s, not waited for
  assert "time limit" in hang["error"] and hang["seconds"] < 8.5 and hang["killed"]
  assert hang["figures"][0]["name"] == "before the hang"
  assert "RESOURCE_EXHAUSTED" in raised["error"]
  assert ok["figures"][0]["value"] == "cpu"  # the dry run pins stage processes to the CPU
  # The report was kept up to date: every stage not started at first, the hang seen running.
  assert updates[0] == ["not started"] * 4 and ["fail", "running", "not started",
                                                "not started"] in updates


def test_the_whole_check_has_one_time_limit(fake_stages, tmp_path):
  results = _runner.run_all([fake_stages("fake_ok")] * 2, dry_run=True,
                            workdir=str(tmp_path / "out"), total_limit_s=4,
                            progress=lambda *a, **k: None)
  assert [r["status"] for r in results] == ["not run", "not run"]
  assert "skipped for time" in results[0]["error"]


def test_the_plan_runs_g_and_b_c_early_and_fits_540_s():
  plan = _runner.in_plan_order(_runner.STAGES)
  assert [s.letter for s in plan] == list("agbcedf")
  assert sum(s.budget_s for s in _runner.STAGES) == _runner.PLAN_TOTAL_S == 540
  ends = dict(zip((s.letter for s in plan), _runner.deadlines(plan, 540)))
  assert ends["g"] <= 100 and ends["c"] <= 240 and ends["f"] == 540
  # --total-limit scales the plan; --stages shares the whole total among the stages picked.
  assert _runner.deadlines(plan, 120)[-1] == pytest.approx(120)
  picked = _runner.in_plan_order([s for s in _runner.STAGES if s.letter in "bg"])
  assert [s.letter for s in picked] == ["g", "b"]
  assert _runner.deadlines(picked, 100) == pytest.approx([100 * 75 / 135, 100])


def _check(dry_run):
  stage = dict(letter="d", stage="bandwidth", title="bandwidth", status="pass", seconds=12.0,
               limit_s=150, checks=dict(passed=3, failed=0), notes=["a note"],
               figures=[dict(name="RTN", value=71.0, unit="% of copy", goal=">= 70%", met=True),
                        dict(name="SR", value=40.0, unit="% of copy", goal=">= 60%", met=False)],
               tables={"bandwidth": [dict(op="quantize RTN", gbps=3000.0, same_bits=True)]})
  env = dict(letter="a", stage="env", title="environment", status="pass", seconds=1.0,
             limit_s=60, figures=[], info=dict(device_kind="NVIDIA H200", platform="gpu"))
  return _report.summarize([env, stage], dry_run=dry_run, seconds=13.0)


def test_summary_prints_each_goal_beside_its_figure():
  table = _report.summary_table(_check(dry_run=False))
  assert "PASSED" in table and "NVIDIA H200" in table
  assert "RTN 71 % of copy (goal >= 70%: met)" in table
  assert "SR 40 % of copy (goal >= 60%: MISSED)" in table
  assert "3/3 checks ok" in table
  dry = _report.summary_table(_check(dry_run=True))
  assert "DRY RUN" in dry and "MISSED" not in dry and "not judged, dry run" in dry
  report = _report.markdown(_check(dry_run=False))
  assert report.startswith("# lpjax GPU check: NVIDIA H200")
  assert "| quantize RTN | 3000 | yes |" in report and "- a note" in report
  assert _report.file_stem(_check(dry_run=False)) == "nvidia-h200"


def test_same_bits_finds_one_flipped_bit_and_a_signed_zero():
  x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
  y = x.copy()
  y.view(np.uint32)[17, 3] ^= 1
  ok, why = _data.same_bits({"v": x}, {"v": y})
  assert not ok and "1 of 2048" in why and "(17, 3)" in why
  assert _data.same_bits((x,), (x.copy(),)) == (True, "")
  assert not _data.same_bits([np.float32([0.0])], [np.float32([-0.0])])[0]
  assert not _data.same_bits([x], [x.astype(np.float64)])[0]


def test_nan_payloads_are_one_category_but_nan_is_not_a_number():
  """docs/numerics.md, "NaN payloads": a GPU may canonicalise NaN payloads (and signs) in a
  bf16 / fp16 conversion; a NaN matches any NaN, never a number, and everything else is bits."""
  import ml_dtypes
  quiet, other = np.float32([np.nan, 1.0]), np.uint32([0xFFC00001, 0x3F800000]).view(np.float32)
  assert _data.same_bits([quiet], [other]) == (True, "")
  b16 = np.array([np.nan, 2.0], ml_dtypes.bfloat16)
  b16_other = b16.copy()
  b16_other.view(np.uint16)[0] = 0xFFC1
  assert _data.same_bits([b16], [b16_other]) == (True, "")
  ok, why = _data.same_bits([quiet], [np.float32([np.inf, 1.0])])
  assert not ok and "NaN in one only: 1" in why
  codes = np.uint8([0x7F, 1])  # integer codes are bits, whatever they would decode to
  assert not _data.same_bits([codes], [np.uint8([0x7E, 1])])[0]
  assert bandwidth._equal_on_device((jnp.asarray(quiet),), (jnp.asarray(other),))
  assert not bandwidth._equal_on_device((jnp.asarray(quiet),), (jnp.float32([0.0, 1.0]),))


@pytest.mark.parametrize("module", ["_data", "_record", "_report", "_runner"])
def test_docstring_examples(module):
  result = doctest.testmod(importlib.import_module(f"benchmarks.gpu_check.{module}"),
                           optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
  assert result.attempted > 0 and result.failed == 0


def test_the_cli_prints_the_summary_table_last(tmp_path):
  out = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--dry-run", "--stages", "a",
                        "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stdout + out.stderr
  assert out.stdout.strip().splitlines()[-1].startswith("| a environment | pass |")
  check = json.loads((tmp_path / "dry-run-cpu.json").read_text())
  assert check["passed"] and check["dry_run"] and check["device"] == "cpu"
  assert "lpjax" not in check["env"]["optional_packages_missing"]
  assert "(dry run)" in (tmp_path / "report.md").read_text()


def _lowers_to_triton(fn, *args):
  """fn lowered for the "cuda" platform on this CPU (the spelling of jax 0.10-0.11) holds a
  Pallas Triton kernel (the custom call that jax 0.11 also names CUSTOM_CALL_TARGET_NAME)."""
  from jax.experimental.pallas import triton as pltriton

  from lpjax.pallas import _support
  reason = _support.cuda_lowering_unavailable()  # a jax that knows no abstract GPU
  if reason:
    pytest.skip(reason)
  target = getattr(pltriton, "CUSTOM_CALL_TARGET_NAME", "xla.gpu.triton").split("$")[-1]
  with _support.cuda_lowering_target():  # jax >= 0.11 on a CPU: an abstract H100
    traced = jax.jit(fn).trace(*args)
    return target in traced.lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("name", [c.name for c in kernels.kernel_cases(False)])
def test_every_stage_c_kernel_lowers_for_cuda(name):
  case = next(c for c in kernels.kernel_cases(False, interpret=False) if c.name == name)
  assert _lowers_to_triton(case.kernel, jax.ShapeDtypeStruct(case.shape, case.dtype))


@pytest.mark.parametrize("size", bandwidth.sizes(False), ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_every_stage_d_kernel_lowers_for_cuda_at_64m_and_256m(fmt, size):
  from lpjax import quant
  x = jax.ShapeDtypeStruct(size, jnp.float32)
  q = jax.eval_shape(lambda v: quant.quantize(v, fmt, impl="xla"), x)
  for name, kernel, _, takes_q in bandwidth.ops(fmt, interpret=False):
    assert _lowers_to_triton(kernel, q if takes_q else x), name


def test_every_stage_f_run_builds_from_its_config():
  """The 60M / 130M / 1B configs name C4 and T5's tokenizer: stage f swaps in random tokens, one
  device and one microbatch, and every planned run must still pass the config checks."""
  runs, candidates, one_b = steps.plan(False)
  specs = [r for r in runs if r] + [dict(one_b, batch=b) for b in candidates]
  assert {(s["size"], s["recipe"]) for s in specs} >= {
      (size, r) for size in ("60m", "130m") for r in ("bf16", "mxfp4", "nvfp4", "quartet")}
  for spec in specs:
    _, state, batch, _ = steps.build_step(dict(spec, abstract=True))
    assert batch["inputs"].shape == (spec["batch"], spec["seq_len"])
    assert all(len(leaf.sharding.device_set) == 1 for leaf in jax.tree.leaves(state))


@pytest.mark.parametrize("fmt", native.FP4_FORMATS)
def test_the_stage_g_fp4_gemm_kernel_lowers_for_cuda(fmt):
  from lpjax import pallas, quant
  for m, n, k in native.shapes(False).values():
    qa, qb = (jax.eval_shape(lambda rows=rows: quant.quantize(jnp.zeros((rows, k)), fmt, impl="xla"))
              for rows in (m, n))
    assert _lowers_to_triton(lambda u, v: pallas.fp4_matmul(u, v, interpret=False), qa, qb), (m, k)


def test_stage_f_on_a_gpu_compares_recipes_and_finds_the_largest_microbatch(monkeypatch, tmp_path):
  """Stage f's GPU plan with the runs faked: its order, the ratios against bf16 with the goal, and
  the 1B search moving past out-of-memory microbatches (no GPU here to run them)."""
  seconds = {"bf16": 1.0, "mxfp4": 1.25, "nvfp4": 1.4, "quartet": 1.6}
  started = []

  def fake_run_one(spec, timeout_s, workdir):
    started.append((spec["size"], spec["recipe"], spec["batch"]))
    if spec["size"] == "1b" and spec["batch"] > 16:
      return dict(spec, ok=False, error="XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory")
    step_s = seconds[spec["recipe"]] * (2 if spec["size"] == "130m" else 1)
    return dict(spec, ok=True, step_s=step_s, tokens_per_s=spec["batch"] * 256 / step_s,
                compile_s=10.0, lower_s=2.0, peak_bytes=2**30)

  monkeypatch.setattr(steps, "run_one", fake_run_one)
  rec = _record.Recorder(str(tmp_path / "f.json"), "steps", deadline=None)
  steps.run(rec, dry_run=False)
  assert started[:4] == [("60m", "bf16", 512), ("60m", "mxfp4", 512), ("130m", "bf16", 512),
                         ("130m", "mxfp4", 512)]  # the goal's runs first
  assert started[4:7] == [("1b", "mxfp4", 64), ("1b", "mxfp4", 32), ("1b", "mxfp4", 16)]
  figures = {f["name"]: f for f in rec.data["figures"]}
  assert figures["60m mxfp4 step"]["value"] == 1.25 and figures["60m mxfp4 step"]["met"]
  assert figures["130m quartet step"]["value"] == 1.6 and figures["130m quartet step"]["goal"] is None
  assert figures["1b largest microbatch on one device"]["value"] == 16
  assert rec.data["checks"] == dict(passed=9, failed=0)


def test_stage_e_traces_the_xla_quantizers_when_asked():
  from lpjax.quant.codec import qarray as _quantize
  before = os.environ.get("LPJAX_PALLAS_AUTO")
  with gemm.quantizers("xla"):
    assert not _quantize._auto_uses_kernels()  # even on a GPU
  assert os.environ.get("LPJAX_PALLAS_AUTO") == before


@pytest.fixture
def kernels_as_on_a_gpu(monkeypatch):
  """impl="auto" and interpret=None as they resolve on a GPU, so a step traced on this CPU holds
  the Triton kernels that stages e and f run there."""
  from lpjax.pallas import _support
  from lpjax.quant.codec import qarray as _quantize
  monkeypatch.setattr(_support, "on_gpu", lambda: True)
  monkeypatch.setattr(_quantize, "_auto_uses_kernels", lambda: True)


@pytest.mark.slow
def test_the_stage_e_and_f_steps_lower_with_the_kernels_for_cuda(kernels_as_on_a_gpu):
  sys.path[:0] = [os.path.join(os.path.join(ROOT, "benchmarks"), d)
                  for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/
  import gemm_overhead
  bf16 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16)
  tokens, d, ff, _ = gemm.shapes(False)  # stage e's MLP on a GPU
  params = {"w_gate": bf16(d, ff), "w_up": bf16(d, ff), "w_down": bf16(ff, d)}
  assert _lowers_to_triton(gemm_overhead.make_step("mxfp4"), params, bf16(tokens, d),
                           jax.random.key(0))
  spec = next(s for s in steps.plan(False)[0] if s and s["recipe"] == "mxfp4")
  step, state, batch, key = steps.build_step(dict(spec, abstract=True))
  assert _lowers_to_triton(step, state, batch, key)


def test_stage_e_shapes_give_the_kernels_real_tiles():
  """ff = 5461 gave (32, 32) / (64, 8) tiles with pad and slice copies; every operand of stage
  e's MLP now tiles as the kernels' default caps, unpadded, on both quantized axes."""
  from lpjax.pallas import _plan
  tokens, d, ff, _ = gemm.shapes(False)
  for shape in ((tokens, d), (d, ff), (ff, d), (tokens, ff)):
    for axis, direction, caps in ((1, "rows", _plan.ROWS_TILE), (0, "cols", _plan.COLS_TILE)):
      view = _plan.make_view(shape, axis, 32, (direction,))
      assert view.tile == caps and (view.m_pad, view.n_pad) == (view.m, view.n), (shape, axis)


def _failing_for(fmt_or_recipe, real):
  def fake(name, *args, **kw):
    if name == fmt_or_recipe:
      raise RuntimeError(f"forced failure of {name} (e.g. a Triton compile error)")
    return real(name, *args, **kw)
  return fake


def test_stage_e_records_each_recipe_on_its_own(monkeypatch, tmp_path):
  """A (recipe, quantizers) case that fails to compile is that case's failure: bf16 is still
  compiled and timed, and the stage ends normally (it used to end at the first error)."""
  sys.path[:0] = [os.path.join(os.path.join(ROOT, "benchmarks"), d)
                  for d in ("common", "memory", "speed", "studies", "sweeps")]  # benchmarks/*/
  import gemm_overhead
  monkeypatch.setattr(gemm_overhead, "make_step", _failing_for("mxfp4", gemm_overhead.make_step))
  rec = _record.Recorder(str(tmp_path / "e.json"), "gemm", deadline=None, dry_run=True)
  gemm.run(rec, dry_run=True)
  assert [f["name"] for f in rec.data["failures"]] == ["mxfp4 (xla quantizers) compiles and runs"]
  assert "forced failure of mxfp4" in rec.data["failures"][0]["detail"]
  assert [r["recipe"] for r in rec.data["tables"]["mlp"]] == ["bf16"]
  assert rec.data["tables"]["mlp"][0]["ms"] > 0 and rec.data["compile_s"] > 0


def test_stage_g_records_each_format_on_its_own(monkeypatch, tmp_path):
  """An MXFP4 failure in stage g no longer loses the NVFP4 case."""
  monkeypatch.setattr(native, "_operands", lambda fmt, *a, real=native._operands, **k: (
      _failing_for("mxfp4", real)(fmt, *a, **k)))
  rec = _record.Recorder(str(tmp_path / "g.json"), "native", deadline=None, dry_run=True)
  native.fp4_kernel(rec, dry_run=True)
  assert [f["name"] for f in rec.data["failures"]] == ["FP4 GEMM kernel mxfp4"]
  assert [r["fmt"] for r in rec.data["tables"]["fp4 gemm kernel"]] == ["nvfp4"]
  assert rec.data["checks"]["passed"] == 2  # NVFP4: the bits, and the reference


def test_stage_g_reference_never_goes_through_the_kernels(kernels_as_on_a_gpu, monkeypatch):
  """With impl="auto" resolving to the Pallas kernels (as on a GPU), stage g's reference GEMM
  still decodes with the XLA path: a kernel under test cannot check itself."""
  from lpjax import pallas, quant
  from lpjax.quant import backends
  import types
  backend = backends.KERNELS["pallas"]

  def broken(*args, **kw):
    raise AssertionError("the reference went through the Pallas dequantize kernel")

  monkeypatch.setitem(backends.KERNELS, "pallas", types.SimpleNamespace(
      **{**vars(backend), "dequantize": broken}))
  qa = quant.quantize(jax.random.normal(jax.random.key(0), (16, 64)), "nvfp4", impl="xla")
  qb = quant.quantize(jax.random.normal(jax.random.key(1), (8, 64)), "nvfp4", impl="xla")
  with pytest.raises(AssertionError, match="Pallas dequantize"):
    quant.dequantize(qa, impl="auto")  # the setting is live: auto would take the kernel
  ref = pallas.native.emulated_matmul(qa, qb)  # its default decode is the XLA path
  want = np.asarray(quant.dequantize(qa, impl="xla"), np.float64) @ np.asarray(
      quant.dequantize(qb, impl="xla"), np.float64).T
  np.testing.assert_allclose(np.asarray(ref), want, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(native.reference(qa, qb)), np.asarray(ref))


def test_stage_f_counts_a_run_cut_off_by_the_deadline_as_skipped_not_failed(monkeypatch, tmp_path):
  def fake_run_one(spec, timeout_s, workdir):
    if spec["recipe"] == "bf16":
      return dict(spec, ok=True, step_s=1.0, tokens_per_s=1.0, compile_s=1.0, lower_s=1.0)
    return dict(spec, ok=False, timed_out=True, error=f"not finished within {timeout_s:.0f} s")

  monkeypatch.setattr(steps, "run_one", fake_run_one)
  rec = _record.Recorder(str(tmp_path / "f.json"), "steps", deadline=time.time() + 30,
                         dry_run=True)
  steps.run(rec, dry_run=True)  # the dry run's cap is 120 s: 30 s left is the stage's deadline
  assert rec.data["checks"] == dict(passed=1, failed=0)
  assert rec.data["cut_short"][0].startswith("tiny mxfp4 (stopped at the stage's deadline")
  check = _report.summarize([dict(rec.data, letter="f", status="pass")], dry_run=True, seconds=1)
  assert not check["passed"] and "INCOMPLETE (2 skipped for time" in _report.summary_table(check)
