//! L. Leader elections: one leader at a time, terms that fence, observers that keep up.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lock_core::{
    Election, Fencing, LeaderInfo, LeaderWatch, Leadership, LockError, MAX_LEADER_VALUE_LEN,
    WaitKind,
};
use tokio::time::Instant;

use crate::ensure;
use crate::harness::{Entries, Harness, LockKind};
use crate::outcome::{CaseFailure, CaseResult, Outcome, Skip};
use crate::support::{crash_release_bound, expect_entries_of, expire_session, unique_name, within};

const CAPABILITY: &str = "elections";

async fn declared(h: &dyn Harness) -> Result<bool, CaseFailure> {
    Ok(h.client().await?.provider.capabilities().elections)
}

/// Waits until the server records exactly `expected` for the election `name`.
async fn expect_candidates(
    h: &dyn Harness,
    name: &str,
    expected: Entries,
    what: &str,
) -> Result<(), CaseFailure> {
    expect_entries_of(h, LockKind::Election, name, expected, what).await
}

/// Campaigns with one try, failing the case if someone else leads.
async fn lead(election: &dyn Election, value: &str) -> Result<Leadership, CaseFailure> {
    election
        .campaign(value.as_bytes(), Some(Duration::ZERO))
        .await
        .map_err(|e| CaseFailure::new(format!("{value}'s campaign on a free election: {e}")))
}

/// Waits (within `bound`) until `election` reports `expected` as its leader.
async fn expect_leader(
    election: &dyn Election,
    expected: Option<&LeaderInfo>,
    bound: Duration,
    what: &str,
) -> Result<(), CaseFailure> {
    let deadline = Instant::now() + bound;
    loop {
        let now = election.leader().await?;
        if now.as_ref() == expected {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(CaseFailure::new(format!(
                "{what}: leader() reports {now:?}; expected {expected:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One leader's time in office as its own client saw it: from the campaign's return to
/// the resignation, or to the loss if its lost signal fired first.
#[derive(Debug, Clone, Copy)]
struct Term {
    term: lock_core::FencingToken,
    began: Instant,
    ended: Instant,
}

/// L1: at most one leader at any instant, across clients; terms grow in the order of
/// office.
pub async fn l1_one_leader_at_a_time(h: &dyn Harness) -> CaseResult {
    if !declared(h).await? {
        return Ok(Outcome::Skipped(Skip::not_declared(CAPABILITY)));
    }
    const CANDIDATES: usize = 4;
    const ROUNDS: usize = 5;
    let timing = h.timing();
    let name = unique_name("l1");
    let terms = Arc::new(Mutex::new(Vec::<Term>::new()));
    let mut clients = Vec::new();
    let mut tasks = Vec::new();
    for index in 0..CANDIDATES {
        let client = h.client().await?;
        let election = client.provider.election(&name)?;
        let terms = Arc::clone(&terms);
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let value = format!("candidate-{index}-{round}");
                let mut leadership = election.campaign(value.as_bytes(), None).await?;
                let began = Instant::now();
                tokio::time::sleep(Duration::from_millis(fastrand::u64(2..8))).await;
                let lost = leadership.lost();
                let ended = Instant::now();
                leadership.resign().await?;
                // A leadership lost while in office ended when the signal fired, at the
                // latest: the resignation's own time is no better.
                ensure!(
                    !lost.is_lost(),
                    "{value} lost its leadership without a fault: {:?}",
                    lost.reason()
                );
                terms
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(Term {
                        term: leadership.term(),
                        began,
                        ended,
                    });
            }
            Ok::<(), CaseFailure>(())
        }));
        clients.push(client);
    }
    let bound = timing.handoff_bound * (CANDIDATES * ROUNDS) as u32 + timing.operation_slack;
    within(bound, "every candidate's rounds", async {
        for task in tasks {
            task.await
                .map_err(|e| CaseFailure::new(format!("task failed: {e}")))??;
        }
        Ok::<(), CaseFailure>(())
    })
    .await??;
    let mut terms = std::mem::take(&mut *terms.lock().unwrap_or_else(PoisonError::into_inner));
    ensure!(
        terms.len() == CANDIDATES * ROUNDS,
        "{} terms recorded; expected {}",
        terms.len(),
        CANDIDATES * ROUNDS
    );
    terms.sort_by_key(|term| term.began);
    let fencing = clients[0].provider.capabilities().fencing;
    for pair in terms.windows(2) {
        let (earlier, later) = (pair[0], pair[1]);
        ensure!(
            later.began >= earlier.ended,
            "two leaders at once: term {} was in office until {:?} after term {} began",
            earlier.term,
            earlier.ended - later.began,
            later.term
        );
        if fencing != Fencing::None {
            ensure!(
                later.term > earlier.term,
                "term {} came after term {}",
                later.term,
                earlier.term
            );
        }
    }
    expect_candidates(h, &name, Entries::new(0, 0), "after every round").await?;
    Ok(Outcome::Passed)
}

/// L2: leader() reports the leader's value and term; terms strictly increase across
/// leaders; with nobody campaigning there is no leader.
pub async fn l2_terms_increase_and_leader_is_reported(h: &dyn Harness) -> CaseResult {
    if !declared(h).await? {
        return Ok(Outcome::Skipped(Skip::not_declared(CAPABILITY)));
    }
    let timing = h.timing();
    let name = unique_name("l2");
    let (a, b) = (h.client().await?, h.client().await?);
    let (ea, eb) = (a.provider.election(&name)?, b.provider.election(&name)?);
    ensure!(
        ea.leader().await?.is_none(),
        "a fresh election reports a leader"
    );
    let fencing = a.provider.capabilities().fencing;
    let mut last: Option<lock_core::FencingToken> = None;
    for (election, value) in [(&ea, "host-a"), (&eb, "host-b"), (&ea, "host-a")] {
        let mut leadership = lead(election.as_ref(), value).await?;
        ensure!(
            leadership.value() == value.as_bytes(),
            "the leadership carries {:?}, campaigned with {value:?}",
            String::from_utf8_lossy(leadership.value())
        );
        let info = leadership.info();
        for (who, observer) in [("the leader", &ea), ("the other client", &eb)] {
            expect_leader(
                observer.as_ref(),
                Some(&info),
                timing.operation_slack,
                &format!("{who}, while {value} leads"),
            )
            .await?;
        }
        if fencing != Fencing::None
            && let Some(last) = last
        {
            ensure!(
                leadership.term() > last,
                "term {} after term {last}",
                leadership.term()
            );
        }
        last = Some(leadership.term());
        leadership.resign().await?;
        ensure!(!leadership.is_lost(), "resigning fired the lost signal");
        expect_leader(
            eb.as_ref(),
            None,
            timing.operation_slack,
            &format!("after {value} resigned"),
        )
        .await?;
    }
    expect_candidates(h, &name, Entries::new(0, 0), "after the last resignation").await?;
    Ok(Outcome::Passed)
}

/// L3: an observer sees the final leader after every change (changes may coalesce).
pub async fn l3_observer_sees_every_final_leader(h: &dyn Harness) -> CaseResult {
    if !declared(h).await? {
        return Ok(Outcome::Skipped(Skip::not_declared(CAPABILITY)));
    }
    let timing = h.timing();
    let name = unique_name("l3");
    let (a, b, watcher) = (h.client().await?, h.client().await?, h.client().await?);
    let (ea, eb) = (a.provider.election(&name)?, b.provider.election(&name)?);
    let mut watch = Arc::clone(&watcher.provider.election(&name)?)
        .observe()
        .await?;
    ensure!(
        watch.current()?.is_none(),
        "the observer starts with a leader before anyone campaigned"
    );
    let bound = timing.handoff_bound;
    let mut first = lead(ea.as_ref(), "host-a").await?;
    settle(
        &mut watch,
        Some(first.info()),
        bound,
        "the observer sees the first leader",
    )
    .await?;
    let waiting = tokio::spawn({
        let eb = Arc::clone(&eb);
        async move { eb.campaign(b"host-b", None).await }
    });
    expect_candidates(h, &name, Entries::new(1, 1), "host-b waits").await?;
    first.resign().await?;
    let mut second = within(
        timing.handoff_bound,
        "host-b's campaign after host-a resigned",
        waiting,
    )
    .await?
    .map_err(|e| CaseFailure::new(format!("task failed: {e}")))??;
    settle(
        &mut watch,
        Some(second.info()),
        bound,
        "the observer sees the next leader",
    )
    .await?;
    // Quick changes: the observer may miss the ones in between, never the last.
    second.resign().await?;
    let mut third = lead(ea.as_ref(), "host-a-again").await?;
    third.resign().await?;
    let last = lead(eb.as_ref(), "host-b-again").await?;
    settle(
        &mut watch,
        Some(last.info()),
        bound,
        "the observer sees the latest of quick changes",
    )
    .await?;
    // Dropped, not resigned: the background resignation is a change like any other.
    drop(last);
    settle(
        &mut watch,
        None,
        bound,
        "the observer sees that nobody leads",
    )
    .await?;
    expect_candidates(h, &name, Entries::new(0, 0), "after the last resignation").await?;
    Ok(Outcome::Passed)
}

/// Waits (within `bound`) until `watch` shows `expected`.
async fn settle(
    watch: &mut LeaderWatch,
    expected: Option<LeaderInfo>,
    bound: Duration,
    what: &str,
) -> Result<(), CaseFailure> {
    within(
        bound,
        what,
        watch.wait_for(|leader| leader == expected.as_ref()),
    )
    .await?
    .map(drop)
    .map_err(|e| CaseFailure::new(format!("{what}: the observation ended: {e}")))
}

/// L4: a resignation hands over to a waiting candidate within the handoff bound, and the
/// herd-free strategies wake that candidate alone.
pub async fn l4_resign_hands_over(h: &dyn Harness) -> CaseResult {
    if !declared(h).await? {
        return Ok(Outcome::Skipped(Skip::not_declared(CAPABILITY)));
    }
    const WAITING: usize = 4;
    let timing = h.timing();
    let name = unique_name("l4");
    let leader = h.client().await?;
    let wait = leader.provider.capabilities().wait;
    let mut office = lead(leader.provider.election(&name)?.as_ref(), "first").await?;
    let mut clients = Vec::new();
    let (elected_tx, mut elected) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for index in 0..WAITING {
        let client = h.client().await?;
        let election = client.provider.election(&name)?;
        let elected = elected_tx.clone();
        tasks.push(tokio::spawn(async move {
            let leadership = election
                .campaign(format!("waiting-{index}").as_bytes(), None)
                .await?;
            let _ = elected.send(leadership);
            Ok::<(), LockError>(())
        }));
        clients.push(client);
    }
    expect_candidates(h, &name, Entries::new(1, WAITING), "the candidates wait").await?;
    tokio::time::sleep(timing.operation_slack / 2).await;
    let before: Vec<_> = clients.iter().map(|c| c.provider.metrics()).collect();
    office.resign().await?;
    let mut next = within(
        timing.handoff_bound,
        "the handover after a resignation",
        elected.recv(),
    )
    .await?
    .ok_or_else(|| CaseFailure::new("no candidate was elected"))?;
    tokio::time::sleep(timing.operation_slack / 2).await;
    let (woken, futile) = clients
        .iter()
        .zip(&before)
        .map(|(client, before)| client.provider.metrics().since(before))
        .fold((0, 0), |(woken, futile), delta| {
            (woken + delta.wakeups, futile + delta.futile_wakeups)
        });
    if wait == WaitKind::NotifyOne {
        ensure!(
            woken == 1 && futile == 0,
            "one resignation woke {woken} candidates ({futile} in vain); a herd-free \
             election wakes the next one alone"
        );
    }
    // Serve the rest, so that nothing is left behind.
    for _ in 1..WAITING {
        next.resign().await?;
        next = within(timing.handoff_bound, "the next handover", elected.recv())
            .await?
            .ok_or_else(|| CaseFailure::new("a candidate was never elected"))?;
    }
    next.resign().await?;
    for task in tasks {
        task.await
            .map_err(|e| CaseFailure::new(format!("task failed: {e}")))??;
    }
    expect_candidates(h, &name, Entries::new(0, 0), "after every candidate").await?;
    Ok(Outcome::Passed)
}

/// L5: a leader whose client dies (its session ended on the server's side, as a crash ends
/// it) is replaced within the crash-release bound, and, where the backend detects losses,
/// its leadership reports the loss.
pub async fn l5_crashed_leader_replaced(h: &dyn Harness) -> CaseResult {
    if !declared(h).await? {
        return Ok(Outcome::Skipped(Skip::not_declared(CAPABILITY)));
    }
    let timing = h.timing();
    let name = unique_name("l5");
    let (a, b) = (h.client().await?, h.client().await?);
    let eb = b.provider.election(&name)?;
    let dead = lead(a.provider.election(&name)?.as_ref(), "doomed").await?;
    let waiting = tokio::spawn({
        let eb = Arc::clone(&eb);
        async move { eb.campaign(b"survivor", None).await }
    });
    expect_candidates(h, &name, Entries::new(1, 1), "the survivor waits").await?;
    expire_session(&a).await?;
    let mut next = within(
        crash_release_bound(h, b.provider.as_ref())? + timing.handoff_bound,
        "the survivor's campaign after the leader's session ended",
        waiting,
    )
    .await?
    .map_err(|e| CaseFailure::new(format!("task failed: {e}")))??;
    if a.provider.capabilities().lost_detection {
        within(
            timing.loss_bound,
            "the dead leader's lost signal",
            dead.lost().wait(),
        )
        .await?;
    }
    if b.provider.capabilities().fencing != Fencing::None {
        ensure!(
            next.term() > dead.term(),
            "the new leader's term {} is not above the dead one's {}",
            next.term(),
            dead.term()
        );
    }
    expect_leader(
        eb.as_ref(),
        Some(&next.info()),
        timing.operation_slack,
        "after the take-over",
    )
    .await?;
    drop(dead);
    next.resign().await?;
    expect_candidates(h, &name, Entries::new(0, 0), "after the survivor resigned").await?;
    Ok(Outcome::Passed)
}

/// L6: a campaign that times out or is cancelled leaves no candidate behind and never
/// leads later; one cancelled as the leadership reaches it hands the leadership on.
pub async fn l6_cancelled_campaign_leaves_nothing(h: &dyn Harness) -> CaseResult {
    if !declared(h).await? {
        return Ok(Outcome::Skipped(Skip::not_declared(CAPABILITY)));
    }
    let timing = h.timing();
    let name = unique_name("l6");
    let (a, b) = (h.client().await?, h.client().await?);
    let (ea, eb) = (a.provider.election(&name)?, b.provider.election(&name)?);
    let mut office = lead(ea.as_ref(), "incumbent").await?;
    match eb.campaign(b"hopeful", Some(Duration::ZERO)).await {
        Err(LockError::Timeout { .. }) => {}
        other => {
            return Err(CaseFailure::new(format!(
                "a zero-timeout campaign on a led election returned {other:?}"
            )));
        }
    }
    match eb.campaign(b"patient", Some(timing.short_timeout)).await {
        Err(LockError::Timeout { .. }) => {}
        other => {
            return Err(CaseFailure::new(format!(
                "a campaign that timed out returned {other:?}"
            )));
        }
    }
    expect_candidates(h, &name, Entries::new(1, 0), "after the timeouts").await?;
    // Cancelled while it waits.
    let cancelled = tokio::spawn({
        let eb = Arc::clone(&eb);
        async move { eb.campaign(b"cancelled", None).await }
    });
    expect_candidates(h, &name, Entries::new(1, 1), "the cancelled one waits").await?;
    cancelled.abort();
    let _ = cancelled.await;
    expect_candidates(h, &name, Entries::new(1, 0), "after the cancel").await?;
    office.resign().await?;
    expect_leader(
        eb.as_ref(),
        None,
        timing.operation_slack,
        "after the incumbent resigned, with the others gone",
    )
    .await?;
    expect_candidates(h, &name, Entries::new(0, 0), "after the resignation").await?;

    // Cancelled as the leadership reaches it: whichever comes first, the cancel or the
    // grant, the leadership goes on to the next candidate.
    let c = h.client().await?;
    let ec = c.provider.election(&name)?;
    for delay in [0, 1, 3, 10].map(Duration::from_millis) {
        let mut office = lead(ea.as_ref(), "incumbent").await?;
        let racing = tokio::spawn({
            let eb = Arc::clone(&eb);
            async move { eb.campaign(b"racing", None).await }
        });
        expect_candidates(h, &name, Entries::new(1, 1), "the racing candidate waits").await?;
        let after = tokio::spawn({
            let ec = Arc::clone(&ec);
            async move { ec.campaign(b"after", None).await }
        });
        expect_candidates(h, &name, Entries::new(1, 2), "both candidates wait").await?;
        let cancel = async {
            tokio::time::sleep(delay).await;
            racing.abort();
            racing.await
        };
        let (resigned, raced) = tokio::join!(office.resign(), cancel);
        resigned?;
        // Won before the cancel landed: a leader like any other, it resigns.
        if let Ok(Ok(mut won)) = raced {
            won.resign().await?;
        }
        let mut next = within(
            timing.handoff_bound * 2 + timing.operation_slack,
            &format!("the next candidate after a cancel {delay:?} into the handover"),
            after,
        )
        .await?
        .map_err(|e| CaseFailure::new(format!("task failed: {e}")))??;
        expect_leader(
            ea.as_ref(),
            Some(&next.info()),
            timing.operation_slack,
            "after a cancel raced the handover",
        )
        .await?;
        next.resign().await?;
        expect_candidates(
            h,
            &name,
            Entries::new(0, 0),
            "after a cancel raced the handover",
        )
        .await?;
    }
    Ok(Outcome::Passed)
}

/// L7: a campaign on a closed provider, or with an oversized value, fails cleanly.
pub async fn l7_bad_campaigns_fail_cleanly(h: &dyn Harness) -> CaseResult {
    if !declared(h).await? {
        return Ok(Outcome::Skipped(Skip::not_declared(CAPABILITY)));
    }
    let timing = h.timing();
    let name = unique_name("l7");
    let election = h.client().await?.provider.election(&name)?;
    // The provider is gone: the handle outlived its session.
    let closed = within(
        timing.operation_slack,
        "a campaign on a closed provider",
        election.campaign(b"late", Some(timing.short_timeout)),
    )
    .await?;
    ensure!(
        matches!(closed, Err(LockError::SessionExpired { .. })),
        "a campaign on a closed provider returned {closed:?}; expected SessionExpired"
    );
    let read = within(
        timing.operation_slack,
        "leader() on a closed provider",
        election.leader(),
    )
    .await?;
    ensure!(
        matches!(read, Err(LockError::SessionExpired { .. })),
        "leader() on a closed provider returned {read:?}; expected SessionExpired"
    );
    let observed = within(
        timing.operation_slack,
        "observe() on a closed provider",
        Arc::clone(&election).observe(),
    )
    .await?;
    ensure!(
        matches!(observed, Err(LockError::SessionExpired { .. })),
        "observe() on a closed provider returned {:?}; expected SessionExpired",
        observed.map(|watch| watch.current())
    );
    let client = h.client().await?;
    let open = client.provider.election(&name)?;
    let huge = vec![b'x'; MAX_LEADER_VALUE_LEN + 1];
    let refused = open.campaign(&huge, Some(timing.short_timeout)).await;
    ensure!(
        matches!(refused, Err(LockError::InvalidArgument { .. })),
        "a campaign with a value of {} bytes returned {refused:?}; expected InvalidArgument",
        huge.len()
    );
    let mut fits = open
        .campaign(&huge[..MAX_LEADER_VALUE_LEN], Some(Duration::ZERO))
        .await?;
    let reported = open.leader().await?;
    ensure!(
        reported.as_ref().map(|leader| leader.value.len()) == Some(MAX_LEADER_VALUE_LEN),
        "a leader with the longest value allowed is reported with {:?} bytes",
        reported.map(|leader| leader.value.len())
    );
    fits.resign().await?;
    expect_candidates(h, &name, Entries::new(0, 0), "after the bad campaigns").await?;
    Ok(Outcome::Passed)
}
