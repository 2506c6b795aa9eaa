//! Where one copy's time goes, phase by phase, on the broker's clock
//! (`germline bench --breakdown`). Figures stay inside the host: a copy's timing depends
//! on what it was given, so they are never part of a call's serialised outcome.

use std::time::Duration;

/// Duration of each phase of one copy's life, in call order.
#[derive(Clone, Debug, Default)]
pub struct CopyTimings {
    /// Taking the copy from the pool: waiting for a fork in progress, killing copies being
    /// readied, and for earlier copies of the germline to be gone.
    pub take: Duration,
    /// Waiting for the previous copy of this germline to be gone (it is killed after its
    /// answer is returned; the next fork waits for its death).
    pub reap: Duration,
    /// G1–G3 and process accounting before the fork.
    pub checks_before: Duration,
    /// The germline into the copy's fresh cgroups (waiting for the move begun when the
    /// previous copy was killed, or making it now).
    pub cgroup: Duration,
    /// Asking the germline to fork until it has stopped again.
    pub fork: Duration,
    /// Starting the germline's move out of the copy's cgroups. The move runs in the
    /// background (on a cgroup v1 host it waits for an RCU grace period: the kernel takes
    /// `cgroup_threadgroup_rwsem` for writing); the copy's view gate waits for its end,
    /// which a fresh copy's "channel connect" phase includes.
    pub leave_cgroup: Duration,
    /// G1–G3, identification of the copy and its namespaces, accounting after the fork.
    pub checks_after: Duration,
    /// The broker's set-up inside the copy's namespaces (listeners, view).
    pub outside: Duration,
    /// Starting the broker's threads for the copy (deadline, death, proxy, slot).
    pub threads: Duration,
    /// Until the copy connected to its channel.
    pub connect: Duration,
    /// Sending the preamble (twin inputs, slot, environment); for a pooled copy, the twin
    /// inputs until the copy has taken them, and its slot and environment.
    pub preamble: Duration,
    /// Mounting a pooled copy's view (a fresh copy's is mounted while it connects).
    pub view: Duration,
    /// MCP `initialize` and `notifications/initialized`.
    pub initialize: Duration,
    /// `tools/call` sent until the first byte of the copy's answer.
    pub first_byte: Duration,
    /// First byte until the whole answer is read.
    pub answer: Duration,
    /// Closing the copy's record (its relay threads are told to stop, not waited for) and
    /// killing it (its death is awaited later).
    pub teardown: Duration,
}

impl CopyTimings {
    /// Every phase with its name, in call order.
    pub fn phases(&self) -> [(&'static str, Duration); 16] {
        [
            ("take from pool", self.take),
            ("reap previous copy", self.reap),
            ("G1-G3 before fork", self.checks_before),
            ("enter copy cgroup", self.cgroup),
            ("fork", self.fork),
            ("leave copy cgroup", self.leave_cgroup),
            ("G1-G3 after fork", self.checks_after),
            ("outside set-up", self.outside),
            ("broker threads", self.threads),
            ("channel connect", self.connect),
            ("preamble", self.preamble),
            ("view mount", self.view),
            ("MCP initialize", self.initialize),
            ("first byte", self.first_byte),
            ("answer", self.answer),
            ("teardown", self.teardown),
        ]
    }

    /// The sum of every phase.
    pub fn total(&self) -> Duration {
        self.phases().iter().map(|(_, d)| *d).sum()
    }
}
