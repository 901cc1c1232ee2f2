"""The fields of an experiment file's top level (``fields.FieldTable``), with the limits they name:
read by ``experiment_file.parse_experiment``, checked again for values the command line or the
Python API sets (``experiment.check_experiment``), and listed on the reference page. Defaults are
``experiment.Experiment``'s (a unit test keeps the two equal)."""

from __future__ import annotations

from testbed.spec.bubbletea import BUBBLETEA_FIELDS
from testbed.spec.compute import COMPUTE_FIELDS
from testbed.spec.fields import REQUIRED, Field, FieldTable
from testbed.spec.model import MODEL_FIELDS
from testbed.spec.pipeline_schedules import DEFAULT_VIRTUAL_STAGES, MAX_VIRTUAL_STAGES, SCHEDULES
from testbed.spec.policy import DEFAULT_POLICY

#: the most TCP connections a cross-DC transfer is striped over (concurrent gloo operations)
MAX_WAN_CONNECTIONS = 16

EXPERIMENT_FIELDS = FieldTable(
    "experiment",
    "",
    "An experiment file (`workloads/*.yaml`): the topology, the model, the parallel layout, the "
    "schedule, the emulated GPU and the policy of a run.",
    (
        Field("name", "text", "the experiment's name in run folders and reports", default_text="the file's name"),
        Field("description", "text", "a sentence on what the experiment is for", default="", default_text="none"),
        Field(
            "topology",
            "path",
            "a shipped topology's name (`three_dc`) or a topology file, relative to the experiment file",
            default=REQUIRED,
        ),
        Field("schedule", "choice", "the pipeline schedule", default="1f1b", choices=SCHEDULES),
        Field(
            "virtual_stages",
            "int",
            "model chunks (virtual stages) each worker holds under interleaved-1f1b",
            default_text=f"{DEFAULT_VIRTUAL_STAGES} under interleaved-1f1b; zbv holds 2, the others 1",
            low=1,
            high=MAX_VIRTUAL_STAGES,
            rule="interleaved-1f1b only; `model.n_layers` a multiple of `stages` x it",
        ),
        Field("iterations", "int", "training iterations of a run", default=10, low=1),
        Field(
            "warmup_iterations",
            "int",
            "first iterations left out of the measured figures",
            default=2,
            low=0,
            rule="below `iterations`",
            fix="measure at least one iteration after warm-up: use 0 or more warm-up iterations",
        ),
        Field("stages", "int", "pipeline stages", default=3, low=1, rule="at most `model.n_layers`"),
        Field("replicas", "int", "data-parallel replicas of each stage", default=2, low=1),
        Field(
            "microbatches",
            "int",
            "microbatches per iteration and replica",
            default=4,
            low=1,
            rule="under interleaved-1f1b and zb-h1, a multiple of its rounds (one per `stages` microbatches)",
        ),
        Field("microbatch_size", "int", "sequences per microbatch", "sequences", 4, low=1),
        Field("model", "section", "the training model's shape", default_text="see its table", table=MODEL_FIELDS.name),
        Field(
            "lr",
            "number",
            "the optimizer's (Adam's) learning rate",
            default=3e-4,
            low=0,
            low_open=True,
            high=1,
            high_open=True,
            fix="write e.g. 0.0003",
        ),
        Field("seed", "int", "seeds the model's weights, the data order and the request stream", default=0),
        Field(
            "data",
            "path",
            "the training text: a file or a folder of text files, relative to the experiment file",
            default_text="Python's standard library sources, byte-level",
        ),
        Field("compute", "section", "the emulated GPU", default_text="see its table", table=COMPUTE_FIELDS.name),
        Field(
            "policy",
            "text",
            "a preset (`pp-fair`, `dp-wan`, `atlas`), `+bubbletea` or `+prefill-alone` after it, and parts "
            "replaced with `/part=value` (`pp-fair/placement=atlas/striping=on/sharing=fifo`)",
            default=DEFAULT_POLICY,
        ),
        Field(
            "wan_connections",
            "int",
            "TCP connections each cross-DC transfer is striped over, under striping",
            default=0,
            default_text="0: chosen from the bandwidth-delay product and one connection's window",
            low=0,
            high=MAX_WAN_CONNECTIONS,
        ),
        Field(
            "wan_connection_share",
            "number",
            "the share of a WAN link one TCP connection fills on the real link modelled (socket buffers are "
            "capped to it)",
            default_text="no cap",
            low=0,
            low_open=True,
            high=1,
            fix="give the share of a link one connection fills, e.g. 0.1",
        ),
        Field(
            "atlas_floor_share",
            "number",
            "under Atlas's grants, the share of a link a held pipeline's class keeps",
            default=0.05,
            low=0,
            high=1,
            high_open=True,
            rule="below 1 / `replicas` under Atlas's grants",
        ),
        Field(
            "atlas_borrow",
            "bool",
            "under Atlas's grants, held classes may borrow the link's idle capacity (HTB ceil at the link rate)",
            default=True,
        ),
        Field(
            "outage_timeout",
            "duration",
            "how long a WAN link may stay down (an outage: a profile's, or `testbed link down`) before the run "
            "aborts, naming the link; training stalls meanwhile and resumes when the link returns",
            "µs",
            default=60_000_000,
            low=1_000_000,
            high=3_600_000_000,
            fix="write a timeout between 1s and 3600s, such as 60s",
        ),
        Field(
            "time_dilation",
            "number",
            "run the emulated world this many times slower than it claims (docs/time-dilation.md): every compute "
            "target, delay and profile time x k, every rate / k, BubbleTea's timers and request times stretched; "
            "the summary reports the emulated frame. For more GPUs or faster links than the machine keeps up with",
            default=1.0,
            low=1,
            high=100,
            rule="1 under `compute.mode: real` (its CPU time has no target to stretch)",
            fix="give a factor from 1 to 100, e.g. 4 (testbed plan suggests the smallest that fits the machine)",
        ),
        Field(
            "gpu_memory_mb",
            "number",
            "one emulated GPU's memory, scaled like the rest; a plan whose stage does not fit is infeasible",
            "MiB",
            default_text="unchecked",
            low=0,
            low_open=True,
        ),
        Field(
            "bubbletea",
            "section",
            "prefill in the bubbles, under a `+bubbletea` policy",
            default_text="see its table",
            table=BUBBLETEA_FIELDS.name,
        ),
    ),
)
