//! A Jepsen-style chaos run: how safe a lock stays under random faults, measured.
//!
//! A run has four parts, each in its own module:
//!
//! - [`register`]: the **fenced register**, a counter outside the lock's backend that accepts
//!   a write only with a fencing token not lower than the last one it accepted, and logs
//!   every write with its verdict. Clients increment it under the lock (read, then write the
//!   value plus one with their token), so that a holder that lost the lock without knowing
//!   is turned away, and a lock that let two holders in at once shows as lost increments.
//! - [`history`]: what each client did and saw, one [`Event`] per operation
//!   with its times on one clock, its token and its outcome.
//! - [`schedule`]: the **nemesis**'s plan, a seeded list of fault windows (the same seed
//!   gives the same plan).
//! - [`checker`]: an **independent checker** over the histories, the register's log and
//!   the plan: stale writes accepted, lost or duplicated increments, intervals in which two
//!   clients both believed they held the lock, progress after each fault, residue.
//!
//! The checker trusts neither the lock nor the register: it recomputes from the logs what
//! each of them claims.
//!
//! [`client`] is one client process's loop, and [`run`] a whole run: real servers (a
//! three-member ZooKeeper ensemble or etcd cluster, as processes or in containers where a
//! member can be cut off from the others; one Redis server, three for Redlock, a primary
//! with two replicas under three sentinels for Redis Sentinel, three primaries with a
//! replica each for Redis Cluster), the
//! register, the clients as OS processes (so that they can be frozen and killed for real),
//! each behind fault proxies of its own (so that it can be cut off), and the nemesis. The
//! memory backend lives in the run's own process, and so do its clients, as tasks that are
//! frozen (no longer polled) and killed (dropped) where they stand.
//! The `chaos` command runs one (`chaos run --backend zookeeper --duration 60s`), checks a
//! finished one again (`chaos check`), and is each client (`chaos client`);
//! `scripts/chaos` runs every backend for ten minutes.

pub mod checker;
pub mod client;
pub mod history;
pub mod register;
pub mod run;
pub mod schedule;
pub mod timeline;

pub use checker::{Check, Report};
pub use history::{Event, EventKind, Outcome};
pub use register::{FencedRegister, RegisterWrite, Verdict};
pub use schedule::{Fault, FaultKind, Plan, PlanOptions};
