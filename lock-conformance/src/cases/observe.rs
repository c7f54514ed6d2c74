//! N. What operators watch: every backend records the same metrics for its locks (see
//! `lock_core::observe`), read here from a recorder this process installs.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use lock_core::LockError;
use lock_core::observe::{
    self, ACQUISITIONS, HELD, HOLD_SECONDS, LOSSES, RENEWALS, WAIT_SECONDS, WAITING,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

use crate::ensure;
use crate::harness::Harness;
use crate::outcome::{CaseFailure, CaseResult, Outcome, Skip};
use crate::support::{TakeAway, crash_release_bound, take, take_away, unique_name, within};

/// One series: its name, its labels (`key=value`, sorted) and its value so far.
struct Series {
    name: String,
    labels: Vec<String>,
    value: f64,
    samples: usize,
}

/// The recorder this process's cases read, and every value it has given so far: a
/// snapshot drains the recorder (counters, gauges' changes, histograms), and the cases of
/// several harnesses read it side by side, so each snapshot is added to the totals.
struct Recorded {
    snapshotter: Snapshotter,
    totals: Mutex<Vec<Series>>,
}

static RECORDED: OnceLock<Option<Recorded>> = OnceLock::new();

/// The recorder, installed on first use with the locks' names as labels (each case keeps
/// to its own lock); `None` when the process has a recorder of its own.
fn recorded() -> Option<&'static Recorded> {
    RECORDED
        .get_or_init(|| {
            let recorder = DebuggingRecorder::new();
            let snapshotter = recorder.snapshotter();
            recorder.install().ok()?;
            observe::label_lock_names(true);
            Some(Recorded {
                snapshotter,
                totals: Mutex::new(Vec::new()),
            })
        })
        .as_ref()
}

impl Recorded {
    /// The series of the lock `lock`, as recorded so far.
    fn of(&self, lock: &str) -> Vec<Series> {
        self.matching(&[&format!("lock={lock}")])
    }

    /// The series with every one of `labels` (`key=value`), as recorded so far.
    fn matching(&self, labels: &[&str]) -> Vec<Series> {
        let mut totals = self
            .totals
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let mut labels: Vec<String> = key
                .key()
                .labels()
                .map(|label| format!("{}={}", label.key(), label.value()))
                .collect();
            labels.sort();
            let name = key.key().name();
            let (value, samples) = match value {
                DebugValue::Counter(count) => (count as f64, 1),
                DebugValue::Gauge(change) => (change.into_inner(), 1),
                DebugValue::Histogram(values) => {
                    (values.iter().map(|v| v.into_inner()).sum(), values.len())
                }
            };
            match totals
                .iter_mut()
                .find(|series| series.name == name && series.labels == labels)
            {
                Some(series) => {
                    series.value += value;
                    series.samples += samples;
                }
                None => totals.push(Series {
                    name: name.to_owned(),
                    labels,
                    value,
                    samples,
                }),
            }
        }
        totals
            .iter()
            .filter(|series| labels.iter().all(|l| series.labels.iter().any(|x| x == l)))
            .map(|series| Series {
                name: series.name.clone(),
                labels: series.labels.clone(),
                value: series.value,
                samples: series.samples,
            })
            .collect()
    }
}

/// The total so far of the series called `metric` with every one of `labels` (`key=value`),
/// as the suite's recorder has them (installed on first use, as for case N1): for a
/// backend's own tests of what it records, such as its reconnections. `None` when the
/// process installed a recorder of its own.
pub fn recorded_total(metric: &str, labels: &[&str]) -> Option<f64> {
    let series = recorded()?.matching(labels);
    Some(total(&series, metric, &[]).0)
}

/// The sum of the values, and of the samples, of the series called `name` with every one
/// of `labels`.
fn total(series: &[Series], name: &str, labels: &[&str]) -> (f64, usize) {
    series
        .iter()
        .filter(|s| s.name == name && labels.iter().all(|l| s.labels.iter().any(|x| x == l)))
        .fold((0.0, 0), |(value, samples), s| {
            (value + s.value, samples + s.samples)
        })
}

/// N1: a grant, a busy try, a timeout, a cancelled wait, a release, a dropped guard and
/// (with lost detection) a loss are each recorded once, with the metric names and the
/// labels every backend uses; the waiting and held gauges come back to zero.
pub async fn n1_metrics_are_the_same_everywhere(h: &dyn Harness) -> CaseResult {
    let Some(recorded) = recorded() else {
        return Ok(Outcome::Skipped(Skip::because(
            "the process installed a metrics recorder of its own, which the suite cannot read",
        )));
    };
    let name = unique_name("n1");
    let timing = h.timing();
    let (a, b) = (h.client().await?, h.client().await?);
    let (lock_a, lock_b) = (a.provider.lock(&name)?, b.provider.lock(&name)?);
    let mut held = take(lock_a.as_ref(), "the first holder").await?;
    let backend = held.backend();
    ensure!(
        lock_b.try_acquire().await?.is_none(),
        "a second holder while the lock was held"
    );
    match lock_b.acquire(Some(timing.short_timeout)).await {
        Err(LockError::Timeout { .. }) => {}
        other => return Err(CaseFailure::new(format!("expected Timeout, got {other:?}"))),
    }
    let cancelled = tokio::time::timeout(timing.short_timeout, lock_b.acquire(None)).await;
    ensure!(cancelled.is_err(), "a wait for a held lock ended by itself");
    held.release().await?;
    let dropped = within(
        timing.handoff_bound,
        "a grant after the release",
        lock_b.acquire(None),
    )
    .await??;
    drop(dropped);
    let lost = if a.provider.capabilities().lost_detection {
        // A dropped guard is released in the background, as a crashed holder's lock is
        // freed: the same bound.
        let freed = crash_release_bound(h, a.provider.as_ref())? + timing.handoff_bound;
        let guard = within(freed, "a grant after the drop", lock_a.acquire(None)).await??;
        take_away(h, &a, &name, TakeAway::SessionExpiry).await?;
        within(timing.loss_bound, "the loss", guard.lost().wait()).await?;
        drop(guard);
        1_u8
    } else {
        0
    };
    // A dropped guard's release may still run in the background; the metrics were recorded
    // as the guards ended.
    tokio::time::sleep(Duration::from_millis(10)).await;

    let series = recorded.of(&name);
    let outcome = |call: &str, outcome: &str| {
        let labels = [format!("call={call}"), format!("outcome={outcome}")];
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        total(&series, ACQUISITIONS, &labels).0
    };
    let counted = [
        ("try_acquire", "granted", 1.0),
        ("try_acquire", "busy", 1.0),
        ("acquire", "timeout", 1.0),
        ("acquire", "cancelled", 1.0),
        ("acquire", "granted", 1.0 + f64::from(lost)),
    ];
    for (call, end, expected) in counted {
        let seen = outcome(call, end);
        ensure!(
            seen == expected,
            "{call} {end}: counted {seen}, expected {expected}"
        );
    }
    let (waited, waits) = total(&series, WAIT_SECONDS, &["outcome=timeout"]);
    ensure!(
        waits == 1 && waited >= timing.short_timeout.as_secs_f64(),
        "the timed-out wait: {waits} samples, {waited} s"
    );
    let ends = [("released", 1), ("dropped", 1), ("lost", usize::from(lost))];
    for (end, expected) in ends {
        let (_, holds) = total(&series, HOLD_SECONDS, &[&format!("end={end}")]);
        ensure!(
            holds == expected,
            "holds that ended {end}: {holds}, expected {expected}"
        );
    }
    let (losses, _) = total(&series, LOSSES, &[]);
    ensure!(
        losses == f64::from(lost),
        "losses counted: {losses}, expected {lost}"
    );
    for gauge in [HELD, WAITING] {
        let (now, _) = total(&series, gauge, &[]);
        ensure!(now == 0.0, "{gauge} is {now} with nothing held or waiting");
    }
    labelled_alike(&series, "mutex")?;
    let expected = format!("backend={backend}");
    for s in series.iter().filter(|s| s.name == ACQUISITIONS) {
        ensure!(
            s.labels.contains(&expected) && s.labels.contains(&"kind=mutex".to_owned()),
            "{ACQUISITIONS} labelled {:?}; the guard's backend is {backend}",
            s.labels
        );
    }
    Ok(Outcome::Passed)
}

/// The labels of every `distlock_acquisitions_total` series of `series`, by key: the same
/// for every kind of lock.
fn labelled_alike(series: &[Series], kind: &str) -> Result<(), CaseFailure> {
    for s in series.iter().filter(|s| s.name == ACQUISITIONS) {
        let keys: Vec<&str> = s
            .labels
            .iter()
            .filter_map(|l| l.split('=').next())
            .collect();
        ensure!(
            keys == ["backend", "call", "kind", "lock", "outcome", "strategy"],
            "{ACQUISITIONS} of the {kind} labelled {:?}",
            s.labels
        );
    }
    Ok(())
}

/// How often the `kind` of lock ended `call` with `outcome`, and how many of its holds
/// ended `end`.
fn counted(series: &[Series], kind: &str, call: &str, outcome: &str, end: &str) -> (f64, usize) {
    let kind = format!("kind={kind}");
    let (call, outcome) = (format!("call={call}"), format!("outcome={outcome}"));
    let acquisitions = total(series, ACQUISITIONS, &[&kind, &call, &outcome]).0;
    let holds = total(series, HOLD_SECONDS, &[&kind, &format!("end={end}")]).1;
    (acquisitions, holds)
}

/// N2: the read-write lock's sides, a semaphore's permits and an election's campaigns are
/// recorded as the mutex is (N1), each under its own `kind` (`read`, `write`, `permit`,
/// `election`): a grant, a busy try and the hold's end; the gauges come back to zero.
pub async fn n2_every_kind_is_recorded(h: &dyn Harness) -> CaseResult {
    let Some(recorded) = recorded() else {
        return Ok(Outcome::Skipped(Skip::because(
            "the process installed a metrics recorder of its own, which the suite cannot read",
        )));
    };
    let client = h.client().await?;
    let capabilities = client.provider.capabilities();
    if !capabilities.reader_writer && !capabilities.semaphore && !capabilities.elections {
        return Ok(Outcome::Skipped(Skip::not_declared(
            "reader_writer, semaphore or elections",
        )));
    }
    let timing = h.timing();
    let mut expected: Vec<(String, &str, &str, &str, &str)> = Vec::new();
    if capabilities.reader_writer {
        let name = unique_name("n2-rw");
        let lock = client.provider.rw_lock(&name)?;
        let mut reading = lock
            .try_read()
            .await?
            .ok_or_else(|| CaseFailure::new("a free read-write lock refused a reader"))?;
        ensure!(
            lock.try_write().await?.is_none(),
            "a writer was granted beside a reader"
        );
        reading.release().await?;
        let writing = within(timing.handoff_bound, "the write hold", lock.write(None)).await??;
        drop(writing);
        expected.push((name.clone(), "read", "try_acquire", "granted", "released"));
        expected.push((name.clone(), "write", "try_acquire", "busy", ""));
        expected.push((name, "write", "acquire", "granted", "dropped"));
    }
    if capabilities.semaphore {
        let name = unique_name("n2-semaphore");
        let semaphore = client.provider.semaphore(&name, 1)?;
        let mut permit =
            within(timing.handoff_bound, "a permit", semaphore.acquire(None)).await??;
        ensure!(
            semaphore.try_acquire().await?.is_none(),
            "a second permit of a one-permit semaphore"
        );
        permit.release().await?;
        expected.push((name.clone(), "permit", "acquire", "granted", "released"));
        expected.push((name, "permit", "try_acquire", "busy", ""));
    }
    if capabilities.elections {
        let name = unique_name("n2-election");
        let election = client.provider.election(&name)?;
        let mut leading = within(
            timing.handoff_bound,
            "leadership",
            election.campaign(b"n2", None),
        )
        .await??;
        leading.resign().await?;
        expected.push((name, "election", "acquire", "granted", "released"));
    }
    // A dropped guard's release may still run in the background; the metrics were recorded
    // as the guards ended.
    tokio::time::sleep(Duration::from_millis(10)).await;
    for (name, kind, call, outcome, end) in expected {
        let series = recorded.of(&name);
        let (acquisitions, holds) = counted(&series, kind, call, outcome, end);
        ensure!(
            acquisitions == 1.0,
            "the {kind} of {name:?}: {call} {outcome} counted {acquisitions} times, expected once"
        );
        ensure!(
            end.is_empty() || holds == 1,
            "the {kind} of {name:?}: {holds} holds ended {end}, expected one"
        );
        labelled_alike(&series, kind)?;
        for gauge in [HELD, WAITING] {
            let (now, _) = total(&series, gauge, &[]);
            ensure!(
                now == 0.0,
                "{gauge} of the {kind} is {now} with nothing held or waiting"
            );
        }
    }
    Ok(Outcome::Passed)
}

/// N3: a lease backend counts the renewals of a held lock's lease
/// (`distlock_renewals_total`, `outcome=renewed`) as its watchdog makes them.
pub async fn n3_renewals_are_counted(h: &dyn Harness) -> CaseResult {
    let Some(recorded) = recorded() else {
        return Ok(Outcome::Skipped(Skip::because(
            "the process installed a metrics recorder of its own, which the suite cannot read",
        )));
    };
    let client = h.client().await?;
    let capabilities = client.provider.capabilities();
    let Some(ttl) = capabilities
        .crash_release_bound
        .filter(|_| capabilities.leases)
    else {
        return Ok(Outcome::Skipped(Skip::not_declared("leases")));
    };
    let name = unique_name("n3");
    let mut guard = take(client.provider.lock(&name)?.as_ref(), "the holder").await?;
    let labels = [
        format!("backend={}", guard.backend()),
        "outcome=renewed".to_owned(),
    ];
    let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
    let renewals = || total(&recorded.matching(&labels), RENEWALS, &[]).0;
    let before = renewals();
    let first = guard.valid_until();
    // The watchdog renews at a third of the lease: within one lease, the lease is later.
    // (The count may come a moment before the guard's new lease: both are awaited.)
    let deadline = tokio::time::Instant::now() + ttl + h.timing().operation_slack;
    loop {
        let renewed = guard.valid_until() > first;
        let counted = renewals().total_cmp(&before).is_gt();
        if renewed && counted {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "within {ttl:?} and the operation slack: the lease renewed {renewed}, \
             {RENEWALS} with {labels:?} above {before} {counted}"
        );
        tokio::time::sleep(ttl / 20).await;
    }
    guard.release().await?;
    Ok(Outcome::Passed)
}
