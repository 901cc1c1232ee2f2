"""One training worker (= one emulated GPU), run inside its host's namespace by the runner.

``python -m testbed.train.worker CONFIG.json RANK``, or forked by the launcher
(``launcher.py``) from a process that has already imported torch and loaded what every worker
needs. It joins the gloo process group over its own
interface (GLOO_SOCKET_IFNAME), keeps its pipeline stage of the seeded model, and runs the
schedule's actions for each iteration: receives and sends between neighbouring stages of its
replica (across the WAN when the stages sit in different DCs), the gradient all-reduce among
the replicas of its stage (inside its DC), and the optimizer step. Every operation is written to
its event file as it completes.

The schedule is executed here, from ``plan/schedule.py``'s action tables, rather than by
``torch.distributed.pipelining``'s schedules: the testbed must time every send, receive wait and
compute operation separately, pad compute to the emulated GPU's duration, and (for BubbleTea)
insert work between actions, none of which those schedules expose. A worker holds one model chunk
per virtual stage of its table (interleaved 1F1B: several; ZB-V: two, its second feeding the
first locally at the V's tip). A split backward (ZB-H1, ZB-V) runs as real autograd in two
parts: the input part (``backward(inputs=[input])``, what the stage before waits for: the weight
gradients are not computed), then, later, the weight part (``backward(inputs=parameters)``, which
walks the retained graph again to reach them); each is padded to its own target.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from testbed.atlas.channel import DONE, READY, RECV, ControlClient
from testbed.bubbletea.alone import serve_alone
from testbed.bubbletea.fill import Fill
from testbed.bubbletea.prefill import PrefillServer
from testbed.model.gpt import Stage, lm_loss
from testbed.plan.placement import rank_of
from testbed.plan.schedule import worker_tables
from testbed.plan.virtual_stages import chunk_numbers, padding_targets_ms, slot_name, stage_homes, transfer_tag
from testbed.plan.worker_config import WorkerConfig, read_stagger, read_worker_config
from testbed.spec.model import activation_bytes, activation_shape
from testbed.trace import schema as T
from testbed.trace.clock import now_ns, sleep_until
from testbed.trace.events import EventWriter
from testbed.train.checkout import leave_together
from testbed.train.data import batch
from testbed.train.input_wait import InputWait
from testbed.train.padding import Padder
from testbed.train.preload import Preloaded, preload
from testbed.train.striping import post_recv_striped, send_striped
from testbed.train.worker_start import start, startup_mark


def main(config_path: str, rank: int) -> None:
    """The worker as its own process (``python -m testbed.train.worker CONFIG RANK``)."""
    cfg = read_worker_config(config_path)
    startup_mark(cfg, rank, "imported")
    run(cfg, rank, preload(cfg))


def run(cfg: WorkerConfig, rank: int, pre: Preloaded) -> None:
    """Train as worker ``rank`` of the run configured by ``cfg``, from ``pre``."""
    started = start(cfg, rank, pre)
    switch, ev, server, my_dp = started.switch, started.ev, started.server, started.dp_group
    exp, me, bt = cfg.training, cfg.worker(rank), cfg.bubbletea
    R, M, mb = exp.replicas, exp.microbatches, exp.microbatch_size
    stage, replica = me.stage, me.replica
    if bt is not None and server is not None and bt.alone:  # no training: the GPU serves prefill alone
        serve_alone(server, exp.iterations, bt.prior_iteration_s, ev)
        finish(cfg, rank, ev, server)
        return
    mcfg = exp.model
    C = exp.chunks  # model chunks (virtual stages) per worker
    homes = stage_homes(exp.schedule, exp.stages, C)
    V, chunk = len(homes), chunk_numbers(homes)  # virtual stages; each one's chunk on its worker
    models = {v: Stage(pre.full_model, v, V) for v in range(V) if homes[v] == stage}
    chunk_params = {v: list(m.parameters()) for v, m in models.items()}
    params = [p for ps in chunk_params.values() for p in ps]
    opt = torch.optim.AdamW(params, lr=exp.lr, weight_decay=0.0)
    train = pre.train_tokens
    padder = Padder(padding_targets_ms(exp.forward_ms, exp.backward_ms, exp.optimizer_target_ms, C), exp.padded)
    actions = worker_tables(exp.schedule, exp.stages, M, C)[stage]
    act_shape = activation_shape(mcfg, mb)
    act_bytes = activation_bytes(mcfg, mb)
    ctl = ControlClient(cfg.control_socket)
    dc_of = {w.rank: w.dc for w in cfg.workers}

    def peer(v: int) -> int:
        """The rank holding virtual stage ``v`` of this replica's pipeline."""
        return rank_of(homes[v], replica, R)

    def connections(other: int) -> int:
        """Connections of a transfer to or from rank ``other``: striped only across the WAN."""
        return exp.wan_connections if dc_of[other] != me.dc else 1

    def crossing(kind: str, boundary: int) -> dict:
        """A transfer's fields on its send and receive wait: its boundary and what crosses it."""
        return {T.VIRTUAL_STAGE: boundary, T.TENSOR: T.ACTIVATIONS if kind == "F" else T.GRADIENTS}

    local: dict[tuple[str, int, int], torch.Tensor] = {}  # what ``hand_on`` kept here (ZB-V's tip)
    pending: list = []  # this iteration's sends in flight
    first = stage == 0  # the pipeline's first worker: it starts each iteration
    prev_end = [now_ns()]  # end of this worker's latest compute: where a bubble starts
    # this thread's waits for its inputs, in the real-time class; each receive's works released
    # once it is back in the fair class (``operation_started``, or an error leaving the loop)
    inputs = InputWait(switch)

    def wait_filling(
        works: list, slot: str, since_ns: int, input_wait: bool = False
    ) -> tuple[int, int, Fill | None, dict[str, int]]:
        """Wait for gloo ``works`` (a bubble that began at ``since_ns``), this thread itself, as
        without BubbleTea; under BubbleTea, where there is anything to prefill, a thread fills the
        bubble meanwhile (``PrefillServer.start_fill``) and is told when the works finished
        (``Fill.end``; it is woken later: ``operation_started``, or at once where no input feeds an
        operation). An ``input_wait`` waits in the real-time class, or where refused with the short
        CPU slice (``thread_slice.WaitSwitch``).
        Returns (when they had finished (ns), as this thread's wait returned; when it began to wait
        for the last of them (ns: every earlier one was in by then); the bubble's fill,
        if any: ``Fill.settle`` says whether a prefill pass had the GPU then; the wait event's
        bubble fields, ``PrefillServer.observe``)."""
        predicted = server.bubble_to_fill(slot) if server is not None else None
        fill = server.start_fill(predicted, since_ns) if server is not None and predicted is not None else None
        last_wait = since_ns
        if input_wait:
            inputs.begin(works)
        try:
            for k, w in enumerate(works):
                if k == len(works) - 1:
                    last_wait = now_ns()
                w.wait()
        finally:
            ready = now_ns()
            if fill is not None:
                fill.end(ready)
        bubble = server.observe(slot, (ready - since_ns) / 1e9) if server is not None else {}
        return ready, last_wait, fill, bubble

    def receive(kind: str, boundary: int, it: int, m: int, slot: str) -> tuple[torch.Tensor, int, Fill | None]:
        """Wait for microbatch ``m``'s activations (``kind`` F) or gradient (B) over the boundary
        after virtual stage ``boundary`` (traced as a receive wait, written once the operation it
        feeds has started: ``computed``), filling the bubble (``wait_filling``).
        Returns (tensor, when it had arrived, the bubble's fill if any)."""
        src = peer(boundary if kind == "F" else boundary + 1)
        buf = torch.empty(act_shape)
        t0 = now_ns()
        ctl.send(RECV, src, rank, it, m, boundary)
        works = post_recv_striped(buf, src, transfer_tag(kind, boundary, m, M), connections(src))
        ready, last_wait, fill, bubble = wait_filling(works, slot, prev_end[0], input_wait=True)
        fields = {T.ITERATION: it, T.MICROBATCH: m, T.LAST_WAIT_NS: last_wait, **crossing(kind, boundary)}
        ev.defer(T.RECV_WAIT, t0, now_ns(), **fields, bytes=act_bytes, peer=src, ready_ns=ready, **bubble)
        return buf, ready, fill

    def operation_started(src: int, it: int, m: int, boundary: int, fill: Fill | None) -> None:
        """The operation fed by microbatch ``m``'s transfer from ``src`` has started: tell Atlas's
        controller the transfer is in, its link free ("done"), and wake the thread that filled
        the bubble, if any (``Fill.wake``), to end its prefill pass at the arrival, this thread
        back in the fair class with the kernel's slice, and only then the receive's works
        released (``InputWait.started``). Messages only now,
        as a GPU's kernel starts on the data while its host sends messages: the threads woken
        (the controller in the real-time class) then take this worker's CPU during its padded
        compute, not between the data's arrival and the operation's start (measured: docs/history.md;
        the filling thread: ``Arrived``)."""
        inputs.started()
        ctl.send(DONE, src, rank, it, m, boundary)
        if fill is not None:
            fill.wake()

    def computed(
        kind: str, t0: int, fields: dict, ready: int | None, fill: Fill | None, part: str | None = None
    ) -> None:
        """Pad a forward or backward (or a ``part`` of one) that started at ``t0`` to its target and
        trace it, with when its input had arrived (``ready``) and whether a prefill pass had the GPU
        then (``fill``: it held the operation back). The events put off until it started are
        written while it is padded (the host's work overlaps the emulated GPU's)."""
        held = fill is not None and fill.settle()  # the filling thread's slice is deferred by now
        real, padded = padder.finish(part or kind, t0, meanwhile=ev.write_deferred)
        if part is not None:
            fields = {**fields, T.PART: part}
        prev_end[0] = now_ns()
        ev.write(
            kind,
            t0,
            prev_end[0],
            **fields,
            real_ns=real,
            padded_ns=padded,
            ready_ns=ready,
            prefill_delay_ns=(t0 - ready) if held else 0,
        )

    def send(t: torch.Tensor, kind: str, boundary: int, it: int, m: int) -> list:
        """Start sending microbatch ``m``'s activations (``kind`` F) or gradient (B) over the
        boundary after virtual stage ``boundary``; returns the pending operations."""
        dst = peer(boundary + 1 if kind == "F" else boundary)
        t0 = now_ns()
        ctl.send(READY, rank, dst, it, m, boundary)
        works = send_striped(t, dst, transfer_tag(kind, boundary, m, M), connections(dst))
        fields = {T.ITERATION: it, T.MICROBATCH: m, **crossing(kind, boundary)}
        ev.write(T.SEND, t0, now_ns(), **fields, bytes=act_bytes, peer=dst)
        return works

    def hand_on(t: torch.Tensor, kind: str, boundary: int, it: int, m: int) -> None:
        """Pass microbatch ``m``'s activations (F) or gradient (B) over the boundary after virtual
        stage ``boundary``: kept here where this worker holds both sides (ZB-V's tip), else sent."""
        if homes[boundary] == homes[boundary + 1]:
            local[(kind, boundary, m)] = t
        else:
            pending.extend(send(t, kind, boundary, it, m))

    def take(
        kind: str, boundary: int, it: int, m: int, slot: str
    ) -> tuple[torch.Tensor, int | None, Fill | None, int | None]:
        """What ``hand_on`` passed over the boundary after virtual stage ``boundary``: (tensor, when
        it had arrived, the bubble's fill, the sender's rank), the last three None where it was kept
        here."""
        if homes[boundary] == homes[boundary + 1]:
            return local.pop((kind, boundary, m)), None, None, None
        t, ready, fill = receive(kind, boundary, it, m, slot)
        return t, ready, fill, peer(boundary if kind == "F" else boundary + 1)

    last_opt_end = None
    stagger_ns = int(cfg.stagger_s[replica] * 1e9) if first and cfg.stagger_s else 0
    # planned again from the first iteration's profile, or when a link's profile changes the WAN
    stagger_file = cfg.stagger_file if first else None
    last_planned: tuple[float, ...] | None = None
    with inputs:  # an error leaving the loop releases the latest receive in the fair class
        for it in range(exp.iterations):
            if stagger_file is not None and (planned := read_stagger(stagger_file)) and planned != last_planned:
                stagger_ns, last_planned = int(planned[replica] * 1e9), planned
            if stagger_ns:  # planned grants: this pipeline starts its iteration after the ones before it,
                # counted from the end of the last optimizer step (the stage's replicas leave the
                # all-reduce together), so that offsets do not add up over iterations
                sleep_until((last_opt_end or now_ns()) + stagger_ns)
            x, y = batch(train, R * M * mb, mcfg.seq_len, exp.seed, it)
            rows = slice(replica * M * mb, (replica + 1) * M * mb)
            x, y = x[rows], y[rows]
            saved: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (virtual stage, mb)
            grads: dict[tuple[int, int], torch.Tensor | None] = {}  # a split backward's output gradient
            local.clear()
            pending.clear()
            loss_sum = 0.0
            for a in actions:
                v, m = a.stage, a.microbatch
                fields = {T.ITERATION: it, T.MICROBATCH: m, T.VIRTUAL_STAGE: v}
                ready, fill, src = None, None, None
                if a.kind == "F":
                    if v == 0:
                        inp = x[m * mb : (m + 1) * mb]
                    else:
                        inp, ready, fill, src = take("F", v - 1, it, m, slot_name("F", m, chunk[v]))
                        inp.requires_grad_()
                    t0 = now_ns()
                    if src is not None:
                        operation_started(src, it, m, v - 1, fill)
                    outp = models[v](inp)
                    if v == V - 1:
                        loss = lm_loss(outp, y[m * mb : (m + 1) * mb]) / M
                        loss_sum += loss.item()
                        outp = loss
                    computed(T.FORWARD, t0, fields, ready, fill)
                    saved[(v, m)] = (inp, outp)
                    if v < V - 1:
                        hand_on(outp.detach(), "F", v, it, m)
                elif a.kind in ("B", "I"):
                    inp, outp = saved[(v, m)] if a.kind == "I" else saved.pop((v, m))
                    grad = None
                    if v < V - 1:
                        grad, ready, fill, src = take("B", v, it, m, slot_name("B", m, chunk[v]))
                    t0 = now_ns()
                    if src is not None:
                        operation_started(src, it, m, v, fill)
                    if a.kind == "B":
                        outp.backward(grad)
                        computed(T.BACKWARD, t0, fields, ready, fill)
                    else:  # the input part: the first virtual stage has no input gradient to make
                        if v > 0:
                            outp.backward(grad, inputs=[inp], retain_graph=True)
                        grads[(v, m)] = grad
                        computed(T.BACKWARD, t0, fields, ready, fill, part=T.INPUT_PART)
                    if v > 0:
                        hand_on(inp.grad, "B", v - 1, it, m)
                else:  # the weight part of a split backward, on the graph its input part kept
                    inp, outp = saved.pop((v, m))
                    t0 = now_ns()
                    outp.backward(grads.pop((v, m)), inputs=chunk_params[v])
                    computed(T.BACKWARD, t0, fields, None, None, part=T.WEIGHT_PART)
            fields = {T.ITERATION: it, T.MICROBATCH: -1}
            t0 = now_ns()
            _, _, fill, bubble = wait_filling(pending, T.SEND_DRAIN_SLOT, prev_end[0])  # the sends drain
            if fill is not None:  # no operation waits on the sends: the filling thread is woken at once
                fill.wake()
            ev.write(T.SEND_WAIT, t0, now_ns(), **fields, **bubble)
            if R > 1:
                t0 = now_ns()
                flat = torch.cat([p.grad.reshape(-1) for p in params])
                work = dist.all_reduce(flat, group=my_dp, async_op=True)
                # BubbleTea fills while the gradients travel (and the peers arrive)
                _, _, fill, bubble = wait_filling([work], T.ALLREDUCE_SLOT, t0)
                if fill is not None:  # the optimizer step waits for no transfer: woken at once
                    fill.wake()
                flat /= R
                offset = 0
                for p in params:
                    n = p.numel()
                    p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
                    offset += n
                ev.write(T.ALLREDUCE, t0, now_ns(), **fields, bytes=flat.numel() * 4, **bubble)
            t0 = now_ns()
            opt.step()
            opt.zero_grad(set_to_none=False)
            opt_real, opt_padded = padder.finish(T.OPTIMIZER, t0)
            opt_end = now_ns()  # the loss's all-reduce below waits for the replicas: not busy time
            loss_value = None
            if homes[-1] == stage:  # this worker computes the loss
                loss_t = torch.tensor([loss_sum])
                if R > 1:
                    dist.all_reduce(loss_t, group=my_dp)
                    loss_t /= R
                loss_value = loss_t.item()
            prev_end[0] = now_ns()
            ev.write(T.OPTIMIZER, t0, opt_end, **fields, loss=loss_value, real_ns=opt_real, padded_ns=opt_padded)
            if server is not None:
                server.report(it, (prev_end[0] - last_opt_end) / 1e9 if last_opt_end else bt.prior_iteration_s)
            last_opt_end = prev_end[0]
    finish(cfg, rank, ev, server)


def finish(cfg: WorkerConfig, rank: int, ev: EventWriter, server: PrefillServer | None) -> None:
    """Send the finished KV caches (BubbleTea), check out with the other workers, close the trace."""
    if server is not None:
        server.close()
    leave_together(rank, len(cfg.workers), cfg.timeout_s)
    ev.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
