//! The cases, one `pub async fn` each over `&dyn Harness`, grouped as in the catalogue.
//!
//! [`CASES`] lists them all, [`catalogue`] renders them as a table, and
//! [`conformance_tests!`](crate::conformance_tests) stamps one
//! test per case from the same list.

use std::future::Future;
use std::pin::Pin;

use crate::harness::Harness;
use crate::outcome::CaseResult;

pub mod api;
pub mod election;
pub mod exclusion;
pub mod fencing;
pub mod herd;
pub mod leases;
pub mod loss;
pub mod multi;
pub mod names;
pub mod observe;
pub mod release;
pub mod resilience;
pub mod rw;
pub mod semaphore;
pub mod timeouts;

/// The future a case returns.
pub type CaseFuture<'a> = Pin<Box<dyn Future<Output = CaseResult> + Send + 'a>>;

/// One entry of the registry.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Case {
    /// The catalogue's id, e.g. `"A7"`.
    pub id: &'static str,
    /// The module the case lives in, e.g. `"exclusion"`.
    pub group: &'static str,
    /// The function's and the stamped test's name, e.g. `"a7_stress"`.
    pub name: &'static str,
    /// What the case checks.
    pub summary: &'static str,
    /// Runs the case.
    pub run: for<'a> fn(&'a dyn Harness) -> CaseFuture<'a>,
}

/// Calls back `$crate::$callback!` with `(args) group::case => "ID", "summary"; ...` for
/// every case: the single list behind both the registry and the stamped tests.
#[doc(hidden)]
#[macro_export]
macro_rules! __with_cases {
    ($callback:ident ($($args:tt)*)) => {
        $crate::$callback! { ($($args)*)
            exclusion::a1_try_acquire_free => "A1", "try_acquire on a free lock returns a guard";
            exclusion::a2_try_acquire_held_returns_none => "A2", "try_acquire from another client while held returns Ok(None) within the operation slack";
            exclusion::a3_not_reentrant => "A3", "not re-entrant: a second acquire from the same provider queues; its try returns None";
            exclusion::a4_names_are_independent => "A4", "different names are independent locks";
            exclusion::a5_reacquire_after_release => "A5", "release then acquire again works; the lock handle is reusable";
            exclusion::a6_release_wakes_waiter => "A6", "a release wakes a blocked waiter within the handoff bound";
            exclusion::a7_stress => "A7", "stress: occupancy never exceeds one, every task finishes, grants add up";
            exclusion::a8_concurrent_try_exactly_one => "A8", "many concurrent try_acquire on a free lock: exactly one wins";
            exclusion::a9_fifo_order => "A9", "(fifo) waiters queued in a known order are granted in that order";
            exclusion::a10_fifo_no_jump => "A10", "(fifo) a waiter ahead that times out or is cancelled lets nobody jump the holder";
            exclusion::a11_overlapping_tries_do_not_all_fail => "A11", "clients that only try, and try again when told of a release, all finish: overlapping tries never all fail on a free lock";
            timeouts::b1_timeout_bounds => "B1", "acquire(Some(t)) while held fails with Timeout after at least t and at most t + slack";
            timeouts::b2_zero_timeout_is_one_try => "B2", "acquire(Some(0)) behaves as one try: never waits";
            timeouts::b3_huge_timeouts => "B3", "huge timeouts are accepted or rejected as InvalidArgument; no panic";
            timeouts::b4_timeout_leaves_no_residue => "B4", "after a timeout no waiter residue remains; the holder is untouched; the next contender is not delayed";
            timeouts::b5_dropped_acquire_leaves_nothing => "B5", "dropping a waiting acquire future leaves no residue and holds nothing";
            timeouts::b6_cancel_at_every_await_point => "B6", "cancel at every await point until the acquire completes or settles in its wait (parks; a polling backend counts two retries in its metrics): no residue, no lock held, every time";
            timeouts::b7_cancel_racing_grant => "B7", "a cancel that races a grant does not strand the lock";
            timeouts::b8_waiter_session_death => "B8", "a waiter whose session ends returns an error and never wins later";
            timeouts::b9_cancel_during_winning_attempt => "B9", "(polling) an acquire dropped at each of its next polls after the release, the winning retry's among them, holds nothing and leaves nothing";
            release::c1_release_frees_without_loss => "C1", "release returns Ok, frees the lock, and does not fire the lost signal";
            release::c2_release_is_idempotent => "C2", "release twice, or drop after release: no-op; a later holder is untouched";
            release::c3_stale_release_is_lost => "C3", "a stale guard's release (after its session's end, and after a revoke where offered) returns Err(Lost) and the new holder still holds";
            release::c4_drop_releases => "C4", "drop without release frees the lock within the crash-release bound";
            release::c5_client_death_frees => "C5", "client death frees the lock within the bound and a waiting contender acquires";
            release::c6_forgotten_guard_freed_with_client => "C6", "mem::forget(guard) then drop the provider: freed within the bound";
            loss::d1_revoke_fires_lost => "D1", "(lost_detection) taking the lock away (the session's end, and a revoke where offered) fires the lost signal within the bound";
            loss::d2_late_subscriber_sees_loss => "D2", "(lost_detection) subscribing after the loss still sees it";
            loss::d3_release_while_waiting_on_lost => "D3", "release while a task waits on the lost signal: no panic, no hang";
            loss::d4_server_pause_fires_lost => "D4", "(fault) server paused past the session: lost fires (by valid_until, where the guard has one); the stale release returns Err(Lost)";
            loss::d5_without_detection_never_fires => "D5", "(fault) without lost_detection a revoke, not the holder's doing, never fires the signal";
            fencing::e1_tokens_increase => "E1", "(fencing) tokens strictly increase across successive holders";
            fencing::e2_token_after_takeover_is_larger => "E2", "(fencing) the holder after a take-over (the session's end, and a revoke where offered) has a larger token than the stale one";
            fencing::e3_fenced_store_rejects_stale => "E3", "(fencing) a fenced store rejects the stale holder's writes";
            fencing::e4_tokens_survive_restart => "E4", "(monotonic, fault) tokens keep increasing across a restart or failover";
            leases::f1_auto_extension => "F1", "(leases) holding for three lease lengths keeps the lock";
            leases::f2_valid_until_bounds => "F2", "(leases) valid_until is in the future at grant and not later than grant + ttl; with lost detection, a session's end fires the lost signal by valid_until";
            leases::f3_no_expired_grant => "F3", "(leases, fault) an acquire slower than the lease fails instead of returning an expired guard";
            names::g1_unusual_names => "G1", "unusual names are distinct locks or InvalidName, consistently, never a panic";
            names::g2_case_sensitive => "G2", "names are case-sensitive";
            names::g3_invalid_names => "G3", "empty, NUL-containing and over-limit names: InvalidName with the reason";
            names::g4_namespaces_are_isolated => "G4", "providers with different roots or prefixes never interfere";
            resilience::h1_unreachable_is_connection_error => "H1", "(fault) server unreachable: Err(Connection), retryable, within a bounded time";
            resilience::h2_wrong_credentials => "H2", "(fault) wrong credentials: an auth error, nothing left behind";
            resilience::h3_restart_while_idle => "H3", "(fault) server restarted while idle: new acquisitions work again";
            resilience::h4_lost_create_reply => "H4", "(fault) the reply to a create is lost: no orphan entry, no deadlock";
            resilience::h5_leader_failover => "H5", "(fault) leader killed while held with waiters: no double grant, waiters served";
            resilience::h6_waiter_entry_deleted => "H6", "(fault) a waiter's entry deleted while waiting: an error or a re-queue; the others proceed";
            rw::i1_readers_share => "I1", "(reader_writer) many readers hold together";
            rw::i2_writer_excludes => "I2", "(reader_writer) a writer excludes readers and writers";
            rw::i3_fair_queue => "I3", "(reader_writer) a waiting writer blocks later readers; readers behind one writer enter together";
            rw::i4_stress => "I4", "(reader_writer) randomized stress: never a writer with anyone; readers do share";
            rw::i5_timeouts_and_cancels_leave_nothing => "I5", "(reader_writer) timeouts and cancels of reads and writes leave no residue";
            semaphore::j1_n_permits => "J1", "(semaphore) N permits, the next try returns None, a release lets the next in";
            semaphore::j2_stress => "J2", "(semaphore) stress: concurrency never exceeds N and does reach N";
            semaphore::j3_permits_are_full_guards => "J3", "(semaphore) permits carry fencing tokens and lost signals";
            api::k1_adapters_pass_mutex_cases => "K1", "semaphore(1) and the write lock pass the exclusion, timeout and release cases";
            api::k2_object_safe_and_debug => "K2", "Arc<dyn ...> works; Guard: Send + 'static; Debug everywhere";
            api::k3_wakeups_per_release => "K3", "a release with W waiters adds the wake-ups the strategy declares";
            election::l1_one_leader_at_a_time => "L1", "(elections) at most one leader at any instant across clients; terms grow in the order of office";
            election::l2_terms_increase_and_leader_is_reported => "L2", "(elections) leader() reports the leader's value and term; terms strictly increase; no campaign, no leader";
            election::l3_observer_sees_every_final_leader => "L3", "(elections) an observer sees the final leader after every change (changes may coalesce)";
            election::l4_resign_hands_over => "L4", "(elections) a resignation hands over within the handoff bound, waking one candidate when herd-free";
            election::l5_crashed_leader_replaced => "L5", "(elections) a leader whose session ends on the server is replaced within the crash-release bound and (with lost detection) reports the loss";
            election::l6_cancelled_campaign_leaves_nothing => "L6", "(elections) campaigns that time out or are cancelled leave no candidate and never lead; one cancelled as it is granted hands the leadership on";
            election::l7_bad_campaigns_fail_cleanly => "L7", "(elections) a campaign, leader() or observe() on a closed provider fails with SessionExpired; an oversized value is refused; nothing is left";
            multi::m1_opposite_orders_never_deadlock => "M1", "sets of locks taken all or none, in opposite and random orders by several clients: no deadlock, no name held twice, each name's tokens increasing";
            multi::m2_timeout_and_cancel_leave_nothing => "M2", "a set that times out, or is dropped while it waits for any member or with its requests in flight, holds nothing and leaves nothing";
            multi::m3_member_lost_fires_the_sets_signal => "M3", "(lost_detection) a held set's member lost fires the set's signal; its release reports the member";
            observe::n1_metrics_are_the_same_everywhere => "N1", "a grant, a busy try, a timeout, a cancel, a release, a drop and a loss are each recorded once, under the metric names and labels of every backend";
            observe::n2_every_kind_is_recorded => "N2", "(reader_writer, semaphore, elections) each kind of lock is recorded as the mutex is, under its own kind label";
            observe::n3_renewals_are_counted => "N3", "(leases) a held lock's lease renewals are counted";
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __registry {
    (() $($group:ident :: $case:ident => $id:literal, $summary:literal;)*) => {
        /// Every case of the suite, in catalogue order.
        pub static CASES: &[Case] = &[
            $(
                Case {
                    id: $id,
                    group: stringify!($group),
                    name: stringify!($case),
                    summary: $summary,
                    run: {
                        fn run(harness: &dyn Harness) -> CaseFuture<'_> {
                            Box::pin($group::$case(harness))
                        }
                        run
                    },
                },
            )*
        ];
    };
}

__with_cases!(__registry());

#[doc(hidden)]
#[macro_export]
macro_rules! __catalogue {
    (() $($group:ident :: $case:ident => $id:literal, $summary:literal;)*) => {
        #[doc = concat!(
            "The catalogue: every behaviour the suite checks, in the order the stamped tests ",
            "run, rendered from the list behind [`CASES`](crate::cases::CASES) and ",
            "[`conformance_tests!`](crate::conformance_tests). A case marked (capability) ",
            "runs only for a provider that declares it, and one marked (fault) only with the ",
            "optional harness hook it names; otherwise it is skipped with the reason. The ",
            "others need only what every harness offers: clients, and the end of a client's ",
            "session ([`SessionExpiry`](crate::SessionExpiry)), with which they make stale ",
            "holders.\n\n",
            "| id | case | what it checks |\n| --- | --- | --- |\n",
            $(
                "| ", $id, " | [`", stringify!($case), "`](crate::cases::", stringify!($group),
                "::", stringify!($case), ") | ", $summary, " |\n",
            )*
        )]
        pub mod catalogue {}
    };
}

__with_cases!(__catalogue());

/// The case with the given catalogue id (`"A7"`) or function name (`"a7_stress"`).
///
/// ```
/// let case = lock_conformance::cases::find("A1").expect("A1 exists");
/// assert_eq!(case.name, "a1_try_acquire_free");
/// ```
pub fn find(id_or_name: &str) -> Option<&'static Case> {
    CASES
        .iter()
        .find(|case| case.id.eq_ignore_ascii_case(id_or_name) || case.name == id_or_name)
}
