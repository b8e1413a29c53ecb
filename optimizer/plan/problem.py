"""The planner's problem: the nodes, the movable workloads and the limits a plan is made under. The
bound and the model both read it."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.protocol import WorkloadClass
from optimizer.decide.costs import Demand
from optimizer.plan.interrupt import SolveStop
from optimizer.plan.pools import POOL_PREFIX, Pool

# CP-SAT's deterministic work limit per second of the time limit its solve has. CP-SAT counts work in
# "deterministic seconds" (about one second of search on the machine its coefficients were fitted on). On the
# shared 2-core machine the benches run on, its deterministic clock advanced 0.18-0.37 units per wall-clock
# second (bench/plan.py fleets, one worker, load average 3-4), so a tenth lets the work limit, not the wall clock,
# end the search there and on anything faster; the bench fleets of up to 1,000 nodes reach their optimum within it.
WORK_PER_SECOND = 0.1


# What putting training beside online serving on one node costs, as a share of the moved workload's monthly cost
# there: an estimate. The two interfere through the node's shared PCIe switches, host memory bandwidth, CPUs and
# caches: co-location studies measure such interference in tens of per cent (Lo et al., "Heracles", ISCA 2015;
# Xiao et al., "Gandiva", OSDI 2018), and the reference article puts mixing the patterns at ~40 % more.
MIXED_NODE_PENALTY = 0.4
# What a service that scales with load pays a month on a node without local NVMe, as a share of its monthly cost:
# an estimate of the GPU time its replicas hold while they load weights over the network instead. A cold start
# takes 10-30 s from network storage and under 2 s from a local NVMe cache (the reference article); at 24 starts
# a day (an autoscaler following a daily cycle, an estimate) that is 24 x 28 s = 672 s of 86,400: 0.78 %. It
# counts only the GPUs' time, not the requests that wait, so it is a floor: among nodes that are otherwise equal
# it decides, and it never outweighs a real saving.
NO_NVME_COLD_START_SHARE = 24 * 28 / 86_400


@dataclass(frozen=True, slots=True)
class Host:
    """The rest of a node as the plan weighs it; None where it is not known. ``training`` and ``serving``: the
    node runs training, or an online service, now (what a workload moving in would sit beside)."""

    cpu_cores_per_gpu: float | None = None
    local_nvme: bool | None = None
    training: bool = False
    serving: bool = False


@dataclass(frozen=True, slots=True)
class Needs:
    """What a workload needs of its target beside GPUs (optimizer/decide/snapshot.py, ``WorkloadNeeds``)."""

    cpu_cores_per_gpu: float | None = None
    local_nvme: bool = False

    def met_by(self, host: Host) -> bool:
        """Whether a node is known to meet every need; an unknown figure meets none (a job starved of CPUs is not
        sent where nobody counted them)."""
        if self.cpu_cores_per_gpu is not None and (
            host.cpu_cores_per_gpu is None or host.cpu_cores_per_gpu < self.cpu_cores_per_gpu
        ):
            return False
        return not self.local_nvme or host.local_nvme is True


@dataclass(frozen=True, slots=True)
class NodeSlot:
    name: str
    hardware: str  # catalog key
    gpus: int
    host: Host = Host()


@dataclass(frozen=True, slots=True)
class Offer:
    """Empty nodes of one hardware type the plan may buy, named ``names`` (at most that many bought)."""

    hardware: str  # catalog key
    gpus: int  # capacity units per node
    monthly_cost: float  # US$ a month per node, amortised: what its GPUs cost at the catalog's price
    names: tuple[str, ...]
    workloads: frozenset[str]  # the workloads it is offered to (those short of some hardware: a small model)

    @property
    def key(self) -> str:
        """The offered nodes' place in the model, as a pool's."""
        return f"{POOL_PREFIX}new:{self.hardware}"

    @property
    def pool(self) -> Pool:
        return Pool(self.key, self.hardware, self.gpus, self.names)


@dataclass(frozen=True, slots=True)
class Kept:
    """An open action on a workload: where an earlier plan sends it, and how much more a different choice must
    save a month to replace it."""

    node: str  # its target node (the workload's own node for a resize in place)
    margin_usd: float


@dataclass(frozen=True, slots=True)
class Movable:
    id: str
    node: str
    demand: Demand
    move_cost_usd: float  # one-off: restart, cold start, lost work since the last checkpoint
    service: str | None = None  # replicas of one inference service are kept on different nodes
    resizable: bool = True  # its p95 covers a daily peak, so it may hold fewer GPUs where that fits
    needs: Needs | None = None  # moved only to nodes that meet them
    scales_with_load: bool = False  # an online service starting replicas with its load: prefers local NVMe

    def may_run_on(self, host: Host) -> bool:
        """Whether a node with ``host`` meets what this workload needs (its own node always does: staying is no
        move)."""
        return self.needs is None or self.needs.met_by(host)

    def host_cost(self, host: Host, monthly: float) -> float:
        """What moving onto a node with ``host`` costs a month beyond its GPUs, ``monthly`` being their cost there:
        training beside online serving or the reverse (``MIXED_NODE_PENALTY``), a service that scales with load
        on a node without local NVMe (``NO_NVME_COLD_START_SHARE``)."""
        extra = 0.0
        cls = self.demand.workload_class
        if (cls is WorkloadClass.TRAINING and host.serving) or (cls is WorkloadClass.INFERENCE and host.training):
            extra += MIXED_NODE_PENALTY * monthly
        if self.scales_with_load and host.local_nvme is False:
            extra += NO_NVME_COLD_START_SHARE * monthly
        return extra


@dataclass(slots=True)
class Problem:
    nodes: list[NodeSlot]
    fixed_usage: dict[str, int]  # GPUs held on each node by workloads that stay where they are
    movable: list[Movable]
    max_moves: int = 20
    min_monthly_savings: float = 100.0
    min_savings_fraction: float = 0.10
    time_limit_s: float = 10.0
    workers: int = 1  # CP-SAT workers; the plan depends on this too (see solve)
    # Destination nodes offered per hardware type, which bounds the model at fleet scale; small fleets get
    # every node (see _Targets.of).
    candidates_per_type: int = 24
    full_model_limit: int = 300_000  # movable workloads x nodes up to which every node is a candidate
    pools: bool = True  # identical idle-room nodes solved as pools (optimizer/plan/pools.py)
    pool_min_members: int = 4  # smaller groups stay separate nodes: pooling them saves nothing
    right_size: bool = True  # online inference may hold fewer GPUs where its daily peak still fits
    units: int = 1  # capacity units per GPU: node GPUs, fixed usage and the plan's GPUs are counted in them
    sharing: dict[str, float] = field(default_factory=dict)  # hardware → the smallest share one-GPU services take
    room_moves: int = 4  # nodes of its own hardware offered to each workload, to make room for others
    room_model_limit: int = 20_000  # movable workloads x nodes up to which such moves are offered
    bound_tolerance: float = 0.005  # at fleet scale, a start this close to the bound's savings is the plan
    exact_model_limit: int = 20_000  # model variables up to which CP-SAT always solves (fleet scale above)
    focus_model_limit: int = 100_000  # model variables above which only the LP's hardware types are offered
    post_solve_share: float = 0.1  # of the time limit kept for what follows the solve (packing, the plan's text)
    stop: SolveStop | None = None  # cuts the solve short from another thread (shutdown)
    offers: list[Offer] = field(default_factory=list)  # nodes the plan may buy (see the module's docstring)
    start: dict[str, str] | None = None  # a feasible placement to start from instead of the greedy and the LP
    kept: dict[str, Kept] = field(default_factory=dict)  # workload id → its open action (see the module's docstring)
    # CP-SAT's deterministic work limit in its own seconds (None: WORK_PER_SECOND × the solve's share of the time
    # limit); the wall-clock limit is only a safety net
    work_limit: float | None = None

    @property
    def work(self) -> float:
        """The deterministic work limit of this problem's solves."""
        if self.work_limit is not None:
            return self.work_limit
        return WORK_PER_SECOND * self.time_limit_s * (1 - self.post_solve_share)
