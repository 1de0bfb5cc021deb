"""One table of DistributedOptimizer's options, and a runner that trains one combination of them
on every rank against one process training on the global batch.

A combination either ends where the one process ends (float32, within the order of float
additions: ``TOLERANCE``) with finite weights and the same loss scale, or is refused when the
optimizer is built, with an error naming the options that conflict (``REFUSED``). Anything
else - a later error, a difference, a NaN - is a failure. Every rank checks its own result; a
case that fails on one rank fails on every rank (the outcomes are allgathered), so the ranks
never part ways.

Used by tests/parallel/test_combinations.py (every pair of option values at least once, plus a
seeded random sample) and scripts/combination_grid.py (the whole grid). One case replays with:

    horovodliterun -np 2 python tests/parallel/combination_cases.py \\
        --case optimizer=adam,impl=fused,shard=gradients,scaler=1
(options left out take their first value) or a seeded sample with ``--seed S --sample N``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import random
import sys
import traceback
from unittest import mock

import torch
import torch.nn.functional as F
from powersgd_reference import Reference

import horovodlite.torch as hvd
from horovodlite.common import launch_env
from horovodlite.torch.powersgd import initial_q

# Each option and its values; the first value is the default of a case that leaves it out.
OPTIONS = {
    "optimizer": ["sgd", "adam", "adamw", "adagrad", "rmsprop"],
    "impl": ["for_loop", "foreach", "fused"],
    "shard": ["none", "optimizer_state", "gradients"],
    "wire": ["allreduce", "reducescatter"],  # HOROVOD_SHARDED_COLLECTIVES (shard only)
    "bucket_view": ["1", "0"],
    "passes": ["1", "2"],
    "clip": ["none", "torch", "opt"],  # torch.nn.utils.clip_grad_norm_ / opt.clip_grad_norm_
    "scaler": ["0", "1"],  # GradScaler, with an overflow on the last rank at one step
    "set_to_none": ["1", "0"],
    "op": ["average", "sum", "predivide"],
    # powersgd: rank 2 (fc1, fc2 and side compress), one warm-up step; the reference applies
    # the same algorithm to the ranks' own gradients (powersgd_reference.py)
    "compression": ["none", "fp16", "powersgd"],
    "groups": ["none", "2"],
    "params": ["plain", "frozen", "unused", "added", "sparse", "nobody"],
    # The optimizer's process_set: every rank, or the first size - 1 (at np 1 the same); a
    # rank outside it trains alone on its own rows.
    "process_set": ["global", "subset"],
    # The dense layers' forward and backward through torch.compile (AOTAutograd's graphs).
    "compile": ["0", "1"],
    # hvd.elastic.run with a commit per step, and every rank failing once in the middle of a
    # step (after backward, its reductions in flight): horovodlite restarts, no rank applied
    # the step and the step is trained again. "step": HOROVOD_ELASTIC_ROLLBACK=step (the
    # default) restores nothing (a sharded optimizer's state goes back to the last commit);
    # "commit": every state goes back to the last commit.
    "reset": ["0", "step", "commit"],
}
STEPS = 4
OVERFLOW_AT = 1  # the step whose loss overflows on the last rank (GradScaler cases)
ADD_AT = 2  # "added": the step before which a param group joins
RESET_AT = 3  # "reset": the step that fails once, on every rank, after its backward passes
ROWS = 4  # rows per rank and backward pass
TOLERANCE = dict(rtol=2e-4, atol=2e-5)
# fp16 on the wire rounds a gradient element near zero to another value or to zero, and Adam's
# first step on an element is about lr times the sign of its gradient: one step of lr (0.01)
# apart is what compression may cost a parameter that joins late (measured: 0.0098). PowerSGD
# against its float64 reference (QR there, Gram-Schmidt here) has the same near-zero elements.
TOLERANCE_FP16 = dict(rtol=2e-2, atol=2.5e-2)
POWERSGD = dict(rank=2, warmup_steps=1)


def valid(case: dict) -> bool:
    """Whether torch itself offers the combination (it has no fused RMSprop; only SGD and
    Adagrad take sparse gradients, and not fused; its clip_grad_norm_ takes no sparse
    gradient); the wire only matters with shard."""
    if case["impl"] == "fused" and case["optimizer"] == "rmsprop":
        return False
    if case["params"] == "sparse" and (case["optimizer"] not in ("sgd", "adagrad")
                                       or case["impl"] == "fused" or case["clip"] != "none"):
        return False
    return case["wire"] == "allreduce" or case["shard"] != "none"


def refused(case: dict) -> tuple | None:
    """The options a correct library refuses together at construction, or None."""
    if case["shard"] != "none":
        if case["compression"] != "none":
            return ("shard", "compression")
        if case["groups"] != "none":
            return ("shard", "groups")
        if case["params"] == "nobody":  # find_unused_parameters=True
            return ("shard", "find_unused_parameters")
    return None


def full_case(partial: dict) -> dict:
    case = {k: v[0] for k, v in OPTIONS.items()}
    for k, v in partial.items():
        if k not in OPTIONS or v not in OPTIONS[k]:
            raise ValueError(f"unknown option {k}={v}; options: {OPTIONS}")
        case[k] = v
    return case


def case_id(case: dict) -> str:
    """Only what differs from the defaults, as ``--case`` takes it."""
    return ",".join(f"{k}={v}" for k, v in case.items() if v != OPTIONS[k][0]) or "defaults"


def parse_id(text: str) -> dict:
    if text == "defaults":
        return full_case({})
    return full_case(dict(item.split("=", 1) for item in text.split(",")))


# One case per refusal rule, each otherwise as plain as it gets.
REFUSAL_CASES = ["shard=optimizer_state,compression=fp16", "shard=gradients,compression=powersgd",
                 "shard=gradients,groups=2", "shard=optimizer_state,params=nobody"]


def pairwise_cases() -> list:
    """Every pair of values of two options in at least one case that trains (allpairspy),
    then ``REFUSAL_CASES``."""
    from allpairspy import AllPairs
    keys = list(OPTIONS)

    def ok(values):  # allpairspy passes a prefix of the options' values
        case = full_case(dict(zip(keys, values)))
        return valid(case) and refused(case) is None
    return ([full_case(dict(zip(keys, values)))
             for values in AllPairs([OPTIONS[k] for k in keys], filter_func=ok)]
            + [parse_id(c) for c in REFUSAL_CASES])


def sampled_cases(seed: int, count: int) -> list:
    """``count`` cases drawn at random among those that train (the refusals are few and
    ``REFUSAL_CASES`` has each)."""
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        case = {k: rng.choice(v) for k, v in OPTIONS.items()}
        if valid(case) and refused(case) is None:
            out.append(case)
    return out


def all_cases() -> list:
    keys = list(OPTIONS)
    cases = (dict(zip(keys, values)) for values in itertools.product(*OPTIONS.values()))
    return [c for c in cases if valid(c)]


# ------------------------------------------------------------------------------ the training

# The "subset" process set: registered at init (init()), the same object for every case.
SUBSET = None


def init() -> None:
    """(Re)starts horovodlite with the "subset" process set registered (from 2 ranks on)."""
    global SUBSET
    if not hvd.is_initialized():
        hvd.init()
    if hvd.size() < 2:
        SUBSET = hvd.global_process_set
        return
    ranks = list(range(hvd.size() - 1))
    hvd.shutdown()
    SUBSET = hvd.ProcessSet(ranks)
    hvd.init(process_sets=[SUBSET])


def parts_of(case: dict) -> list:
    """The ranks whose rows this rank's training averages: its process set's, or its own."""
    rank = hvd.rank()
    if case["process_set"] == "global":
        return list(range(hvd.size()))
    return list(SUBSET.ranks) if rank in SUBSET.ranks else [rank]


def _body(fc1, fc2, x):
    h = torch.tanh(fc1(x))
    return h, fc2(h)


_COMPILED = []  # one compiled _body per process: the modules are its inputs, no recompiles


def body(case: dict):
    if case["compile"] == "0":
        return _body
    if not _COMPILED:
        _COMPILED.append(torch.compile(_body, backend="aot_eager"))
    return _COMPILED[0]


class Net(torch.nn.Module):
    def __init__(self, params: str, compiled: str = "0"):
        super().__init__()
        self.body = body({"compile": compiled})
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(10, 8, sparse=True) if params == "sparse" else None
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)
        # "unused": used by rank 0's rows only; "added": joins the optimizer at ADD_AT;
        # "nobody": in the optimizer, used by no rank (find_unused_parameters=True)
        self.side = torch.nn.Linear(16, 4) if params in ("unused", "added", "nobody") else None
        if params == "frozen":
            self.fc1.bias.requires_grad_(False)

    def forward(self, x, idx, part: int, step: int, params: str):
        if self.emb is not None:
            x = x + self.emb(idx)
        h, out = self.body(self.fc1, self.fc2, x)
        if (params == "unused" and part == 0) or (params == "added" and step >= ADD_AT):
            out = out + self.side(h)
        return out


def make_optimizer(case: dict, params):
    kw = {}
    if case["impl"] != "for_loop":
        kw[case["impl"]] = True
    make = {
        "sgd": lambda: torch.optim.SGD(params, lr=0.05, momentum=0.9, **kw),
        "adam": lambda: torch.optim.Adam(params, lr=0.01, **kw),
        "adamw": lambda: torch.optim.AdamW(params, lr=0.01, weight_decay=0.1, **kw),
        "adagrad": lambda: torch.optim.Adagrad(params, lr=0.05, **kw),
        "rmsprop": lambda: torch.optim.RMSprop(params, lr=0.01, momentum=0.5, **kw),
    }
    return make[case["optimizer"]]()


def trained_params(model: Net, case: dict) -> list:
    return [p for n, p in model.named_parameters()
            if p.requires_grad and not (case["params"] == "added" and n.startswith("side."))]


def data(step: int, size: int, passes: int):
    g = torch.Generator().manual_seed(100 + step)
    n = size * passes * ROWS
    x = torch.randn(passes, size, ROWS, 8, generator=g)
    y = torch.randn(passes, size, ROWS, 4, generator=g)
    idx = torch.randint(0, 10, (passes, size, ROWS), generator=g)
    assert x.numel() == n * 8
    return x, y, idx


def chunk_loss(model, case, x, y, idx, part, step, parts, size, pass_):
    """Rank ``part``'s loss, as a share of the mean over ``parts`` (the ranks averaged)."""
    loss = F.mse_loss(model(x[pass_, part], idx[pass_, part], part, step, case["params"]),
                      y[pass_, part])
    if case["op"] != "sum":
        loss = loss / len(parts)  # averaged over ranks: each rank's share of the global mean
    if case["scaler"] == "1" and step == OVERFLOW_AT and part == size - 1 and pass_ == 0:
        loss = loss * float("inf")
    return loss


def clip(case, opt, params):
    if case["clip"] == "torch" or (case["clip"] == "opt" and not hasattr(opt, "clip_grad_norm_")):
        torch.nn.utils.clip_grad_norm_(params, 0.05)
    elif case["clip"] == "opt":
        opt.clip_grad_norm_(0.05)


def make_scaler(case: dict):
    return torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=2,
                                enabled=case["scaler"] == "1")


def train_reference(case: dict, parts: list, size: int):
    """One process, the rows of ``parts`` (of ``size`` ranks): each backward pass's loss is the
    ranks' losses combined as the ranks' gradients are (mean or sum)."""
    model = Net(case["params"], case["compile"])
    opt = make_optimizer(case, trained_params(model, case))
    scaler = make_scaler(case)
    passes = int(case["passes"])
    powersgd = None
    if case["compression"] == "powersgd" and compressed_here(case):
        powersgd = Reference(POWERSGD["rank"], POWERSGD["warmup_steps"], len(parts),
                             lambda name, m: initial_q(0, name, m, POWERSGD["rank"]), op="sum")
    if case["reset"] != "0" and model.emb is not None:
        # hvd.elastic.run's first sync: broadcast_optimizer_state leaves zeros where .grad was
        # None; under zero_grad(set_to_none=False) the embedding's sparse gradients are then
        # added into them, densely (the other parameters get a gradient every step)
        model.emb.weight.grad = torch.zeros_like(model.emb.weight)
    for step in range(STEPS):
        if case["params"] == "added" and step == ADD_AT:
            opt.add_param_group({"params": list(model.side.parameters())})
        opt.zero_grad(set_to_none=case["set_to_none"] == "1")
        x, y, idx = data(step, size, passes)
        if powersgd is not None:
            powersgd_backward(model, case, opt, scaler, powersgd, (x, y, idx), step, parts, size)
        else:
            for pass_ in range(passes):
                loss = sum(chunk_loss(model, case, x, y, idx, part, step, parts, size, pass_)
                           for part in parts)
                scaler.scale(loss).backward()
        scaler.unscale_(opt)
        if case["clip"] != "none":
            torch.nn.utils.clip_grad_norm_(
                [p for g in opt.param_groups for p in g["params"]], 0.05)
        scaler.step(opt)
        scaler.update()
    return model, scaler


def compressed_here(case: dict) -> bool:
    """Whether this rank's optimizer reduces (and so compresses): outside its process set it
    trains alone, uncompressed."""
    return case["process_set"] == "global" or hvd.rank() in SUBSET.ranks


def powersgd_backward(model, case, opt, scaler, reference, batch, step, parts, size) -> None:
    """The reference's backward passes with PowerSGD: each rank's own gradients (its share of
    the global loss, scaled, summed over the passes), then ``.grad`` = the reference
    algorithm's sum of the ranks' approximations. Sparse gradients are summed as they are."""
    x, y, idx = batch
    names = {p: n for n, p in model.named_parameters()}
    params = [p for g in opt.param_groups for p in g["params"] if p.requires_grad]
    own = [{} for _ in parts]
    for pass_ in range(int(case["passes"])):
        for i, part in enumerate(parts):
            loss = scaler.scale(chunk_loss(model, case, x, y, idx, part, step, parts, size,
                                           pass_))
            for p, g in zip(params, torch.autograd.grad(loss, params, allow_unused=True)):
                if g is not None:
                    own[i][names[p]] = g if names[p] not in own[i] else own[i][names[p]] + g
    dense = {names[p] for p in params if p.grad is not None and not p.grad.is_sparse}
    own = [{n: (g.to_dense() if n in dense else g) for n, g in grads.items()} for grads in own]
    sparse = {n for grads in own for n, g in grads.items() if g.is_sparse}
    reduced = reference.reduce([{n: g for n, g in grads.items() if n not in sparse}
                                for grads in own])
    for n in sparse:
        reduced[n] = torch.stack([grads[n] for grads in own if n in grads]).sum(0).coalesce()
    for p in params:
        if names[p] in reduced:
            g = reduced[names[p]].to(p.dtype)
            # autograd adds a sparse gradient into a dense .grad densely (the zeros that
            # hvd.elastic.run's first sync leaves, kept by zero_grad(set_to_none=False)): the
            # ranks then reduce, and compress, a dense gradient
            p.grad = g if p.grad is None or p.grad.is_sparse else p.grad.zero_() + g


def _wrap(case: dict, model: Net, opt):
    kw = dict(named_parameters=model.named_parameters(),
              backward_passes_per_step=int(case["passes"]),
              bucket_view=case["bucket_view"] == "1")
    if case["op"] == "sum":
        kw["op"] = hvd.Sum
    elif case["op"] == "predivide":
        kw["gradient_predivide_factor"] = 2.0
    if case["compression"] == "fp16":
        kw["compression"] = hvd.Compression.fp16
    elif case["compression"] == "powersgd":
        kw["compression"] = hvd.Compression.powersgd(**POWERSGD)
    if case["groups"] != "none":
        kw["groups"] = int(case["groups"])
    if case["shard"] != "none":
        kw["shard"] = case["shard"]
    if case["process_set"] == "subset":
        kw["process_set"] = SUBSET
    if case["params"] == "nobody":
        kw["find_unused_parameters"] = True
    return hvd.DistributedOptimizer(opt, **kw)


@contextlib.contextmanager
def _wire(case: dict):
    old = os.environ.get("HOROVOD_SHARDED_COLLECTIVES")
    os.environ["HOROVOD_SHARDED_COLLECTIVES"] = case["wire"]
    try:
        yield
    finally:
        if old is None:
            del os.environ["HOROVOD_SHARDED_COLLECTIVES"]
        else:
            os.environ["HOROVOD_SHARDED_COLLECTIVES"] = old


def train_distributed(case: dict):
    """This rank's part of the global batch, with horovodlite and Horovod's recipe (an
    explicit ``synchronize()`` before clipping or the scaler). Returns (model, scaler), or
    raises; a refusal raises ``hvd.HorovodArgumentError`` from the constructor (``Refused``)."""
    size, rank = hvd.size(), hvd.rank()
    parts = parts_of(case)
    model = Net(case["params"], case["compile"])
    opt = make_optimizer(case, trained_params(model, case))
    with _wire(case):
        try:
            opt = _wrap(case, model, opt)
        except hvd.HorovodArgumentError as exc:
            raise Refused(str(exc)) from exc
    scaler = make_scaler(case)
    passes = int(case["passes"])
    explicit = case["scaler"] == "1" or case["clip"] != "none"

    def train_step(step: int, fail: bool) -> None:
        if case["params"] == "added" and step == ADD_AT:
            opt.add_param_group({"params": list(model.side.parameters())})
        opt.zero_grad(set_to_none=case["set_to_none"] == "1")
        x, y, idx = data(step, size, passes)
        for pass_ in range(passes):
            loss = chunk_loss(model, case, x, y, idx, rank, step, parts, size, pass_)
            if case["op"] != "sum":
                loss = loss * len(parts)  # the optimizer averages
            scaler.scale(loss).backward()
        if fail:
            raise hvd.HorovodInternalError(f"combination case: a failure at step {step}")
        if not explicit:
            opt.step()
            return
        opt.synchronize()
        scaler.unscale_(opt)
        if case["clip"] != "none":
            clip(case, opt, [p for g in opt.param_groups for p in g["params"]])
        with opt.skip_synchronize():
            scaler.step(opt)
        scaler.update()

    if case["reset"] == "0":
        for step in range(STEPS):
            train_step(step, fail=False)
        return model, scaler
    failed = []
    state = hvd.elastic.TorchState(model=model, optimizer=opt, scaler=scaler, step=0)

    @hvd.elastic.run
    def train(state):
        while state.step < STEPS:
            fail = state.step == RESET_AT and not failed
            failed.extend([True] if fail else [])
            train_step(state.step, fail)
            state.step += 1
            state.commit()

    with mock.patch.dict(os.environ, {launch_env.ELASTIC_ROLLBACK: case["reset"]}):
        train(state)
    if not failed:
        raise AssertionError("the reset case never failed")
    return model, scaler


class Refused(Exception):
    pass


def check(case: dict) -> tuple:
    """Runs ``case`` on this rank: ("equal" | "refused" | "wrong" | "error", detail)."""
    expect = refused(case)
    try:
        model, scaler = train_distributed(case)
    except Refused as exc:
        text = str(exc)
        if expect is None:
            return "wrong", f"refused, but one process trains it: {text}"
        missing = [o for o in expect if o not in text]
        if missing:
            return "wrong", f"refused without naming {missing}: {text}"
        return "refused", text
    except Exception:
        return "error", traceback.format_exc(limit=6)
    if expect is not None:
        return "wrong", f"should be refused at construction naming {expect}, but trained"
    reference, ref_scaler = train_reference(case, parts_of(case), hvd.size())
    tol = TOLERANCE if case["compression"] == "none" else TOLERANCE_FP16
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        if not torch.isfinite(p).all():
            return "wrong", f"{name} is not finite"
        if not torch.allclose(p.detach(), q.detach(), **tol):
            diff = (p - q).abs().max().item()
            return "wrong", f"{name} differs from one process by {diff:.3g}"
    if scaler.is_enabled() and scaler.get_scale() != ref_scaler.get_scale():
        return "wrong", f"loss scale {scaler.get_scale()} vs {ref_scaler.get_scale()}"
    return "equal", ""


def run(cases: list) -> list:
    """Every case on every rank; each case's outcome is the worst any rank saw, with that
    rank's detail."""
    order = ["equal", "refused", "wrong", "error"]
    out = []
    for i, case in enumerate(cases):
        status, detail = check(case)
        seen = hvd.allgather_object((status, detail), name=f"combination.{i}")
        worst = max(range(len(seen)), key=lambda r: order.index(seen[r][0]))
        status, detail = seen[worst]
        if status in ("wrong", "error"):
            detail = f"rank {worst}: {detail}"
        out.append((case, status, detail))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", default=[], help="a case id (repeatable)")
    parser.add_argument("--seed", type=int, help="a seeded random sample of cases")
    parser.add_argument("--sample", type=int, default=20, help="how many (with --seed)")
    parser.add_argument("--pairwise", action="store_true", help="the pairwise-covering set")
    parser.add_argument("--all", action="store_true", help="the whole grid")
    parser.add_argument("--part", default="0/1", help="K/N: every N-th case from the K-th")
    args = parser.parse_args(argv)
    cases = [parse_id(c) for c in args.case]
    if args.seed is not None:
        cases += sampled_cases(args.seed, args.sample)
    if args.pairwise:
        cases += pairwise_cases()
    if args.all:
        cases += all_cases()
    k, n = (int(v) for v in args.part.split("/"))
    cases = cases[k::n]
    init()
    results = run(cases)
    if hvd.rank() == 0:
        for case, status, detail in results:
            print(f"{status:8s} {case_id(case)}" + (f"\n    {detail}" if detail else ""),
                  flush=True)
        counts = {s: sum(r[1] == s for r in results) for s in ("equal", "refused", "wrong",
                                                                "error")}
        print("RESULT " + " ".join(f"{k}={v}" for k, v in counts.items()), flush=True)
    bad = any(r[1] in ("wrong", "error") for r in results)
    hvd.shutdown()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
