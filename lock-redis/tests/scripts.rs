//! The Lua scripts driven directly on a real server, for the interleavings the public API
//! cannot produce on demand (a reply lost at one exact point).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed set-up or check must fail the test"
)]

mod common;

use std::time::Duration;

use common::{admin, start_server};
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};

/// How long a hand-off's claim lasts here: short, so that it lapses during the test.
const CLAIM_MS: u64 = 50;
const TTL_MS: u64 = 10_000;
const LIVENESS_MS: u64 = 10_000;

fn script(prelude: &str, body: &str) -> Script {
    Script::new(&format!("{prelude}\n{body}"))
}

/// The mutex's queue scripts on the lock `{t}`.
struct Mutex {
    attempt: Script,
    release: Script,
}

impl Mutex {
    fn new() -> Self {
        let handoff = include_str!("../src/scripts/handoff.lua");
        Mutex {
            attempt: script(handoff, include_str!("../src/scripts/attempt.lua")),
            release: script(handoff, include_str!("../src/scripts/release.lua")),
        }
    }

    async fn run(
        &self,
        script: &Script,
        admin: &mut ConnectionManager,
        id: &str,
        queue: &str,
    ) -> i64 {
        self.run_candidate(script, admin, id, queue, "", None).await
    }

    /// As [`run`](Self::run), for an election: the candidates' values under `values`, and
    /// `value` sent as a join or a try sends it.
    async fn run_candidate(
        &self,
        script: &Script,
        admin: &mut ConnectionManager,
        id: &str,
        queue: &str,
        values: &str,
        value: Option<&str>,
    ) -> i64 {
        let mut invocation = script.prepare_invoke();
        for key in ["owner", "fence", "queue", "deadlines", "released"] {
            invocation.key(format!("{{t}}:{key}"));
        }
        invocation
            .arg(id)
            .arg(TTL_MS)
            .arg(LIVENESS_MS)
            .arg("{t}:w:")
            .arg("queue")
            .arg("{t}:released")
            .arg(CLAIM_MS)
            .arg(values)
            .arg(queue);
        if let Some(value) = value {
            invocation.arg(value);
        }
        invocation.invoke_async(admin).await.unwrap()
    }
}

/// The permit scripts on the semaphore `{p}` of one permit.
struct Permits {
    attempt: Script,
    release: Script,
}

impl Permits {
    fn new() -> Self {
        let permits = include_str!("../src/scripts/permits.lua");
        Permits {
            attempt: script(permits, include_str!("../src/scripts/permit_attempt.lua")),
            release: script(permits, include_str!("../src/scripts/permit_release.lua")),
        }
    }

    async fn run(
        &self,
        script: &Script,
        admin: &mut ConnectionManager,
        id: &str,
        queue: &str,
    ) -> i64 {
        let mut invocation = script.prepare_invoke();
        for key in [
            "holders",
            "fence",
            "queue",
            "deadlines",
            "released",
            "weights",
        ] {
            invocation.key(format!("{{p}}:{key}"));
        }
        invocation
            .arg(id)
            .arg(TTL_MS)
            .arg(LIVENESS_MS)
            .arg("{p}:w:")
            .arg(CLAIM_MS)
            .arg(1)
            .arg(queue)
            .arg(1);
        invocation.invoke_async(admin).await.unwrap()
    }
}

/// A waiter whose join reply was lost is handed the lock; its claim lapses before it
/// learns of it, and another contender takes the lock. Its join, sent again, must queue it
/// with an empty list: the token left there would otherwise be taken for a grant while the
/// other holds the lock.
#[tokio::test]
async fn a_token_left_by_a_lapsed_claim_is_no_grant() {
    let server = start_server().await;
    let mut admin = admin(&server).await;

    let mutex = Mutex::new();
    assert_eq!(mutex.run(&mutex.attempt, &mut admin, "h", "0").await, 1);
    assert_eq!(mutex.run(&mutex.attempt, &mut admin, "w", "1").await, 0);
    assert_eq!(mutex.run(&mutex.release, &mut admin, "h", "").await, 1);
    let handed: i64 = admin.llen("{t}:w:w").await.unwrap();
    assert_eq!(handed, 1, "the hand-off pushed w's token");
    tokio::time::sleep(Duration::from_millis(CLAIM_MS * 3)).await;
    assert_eq!(mutex.run(&mutex.attempt, &mut admin, "x", "0").await, 3);
    assert_eq!(mutex.run(&mutex.attempt, &mut admin, "w", "1").await, 0);
    let left: i64 = admin.llen("{t}:w:w").await.unwrap();
    assert_eq!(
        left, 0,
        "mutex: a queued waiter's list holds no stale token"
    );

    let permits = Permits::new();
    assert_eq!(permits.run(&permits.attempt, &mut admin, "h", "0").await, 1);
    assert_eq!(permits.run(&permits.attempt, &mut admin, "w", "1").await, 0);
    assert_eq!(permits.run(&permits.release, &mut admin, "h", "").await, 1);
    let handed: i64 = admin.llen("{p}:w:w").await.unwrap();
    assert_eq!(handed, 1, "the admission pushed w's token");
    tokio::time::sleep(Duration::from_millis(CLAIM_MS * 3)).await;
    assert_eq!(permits.run(&permits.attempt, &mut admin, "x", "0").await, 3);
    assert_eq!(permits.run(&permits.attempt, &mut admin, "w", "1").await, 0);
    let left: i64 = admin.llen("{p}:w:w").await.unwrap();
    assert_eq!(
        left, 0,
        "permits: a queued waiter's list holds no stale token"
    );
}

/// An election candidate whose value is gone (a failover lost it, or its refreshes stopped
/// for longer than it lasts) never leads with an empty value: a hand-off passes it over,
/// and its own refresh gives its place up, whether the lock is held or free.
#[tokio::test]
async fn a_candidate_without_its_value_never_leads() {
    const VALUES: &str = "{t}:v:";
    let server = start_server().await;
    let mut admin = admin(&server).await;
    let m = Mutex::new();
    let (attempt, release) = (&m.attempt, &m.release);

    assert_eq!(
        m.run_candidate(attempt, &mut admin, "h", "0", VALUES, Some("h"))
            .await,
        1
    );
    for candidate in ["c", "d"] {
        let queued = m.run_candidate(attempt, &mut admin, candidate, "1", VALUES, Some(candidate));
        assert_eq!(queued.await, 0, "{candidate} queued");
    }
    let _: () = admin.del("{t}:v:c").await.unwrap();
    assert_eq!(
        m.run_candidate(release, &mut admin, "h", "", VALUES, None)
            .await,
        1
    );
    let owner: Option<String> = admin.get("{t}:owner").await.unwrap();
    assert_eq!(owner.as_deref(), Some("d"), "the hand-off passed c over");
    assert_eq!(
        m.run_candidate(attempt, &mut admin, "c", "2", VALUES, None)
            .await,
        -1
    );
    assert_eq!(
        m.run_candidate(attempt, &mut admin, "d", "2", VALUES, None)
            .await,
        2
    );

    // The lock free (d's lease ran out) with c first in the queue, its value gone.
    let joined = m.run_candidate(attempt, &mut admin, "c", "1", VALUES, Some("c"));
    assert_eq!(joined.await, 0);
    let _: () = admin.del(&["{t}:owner", "{t}:v:c"]).await.unwrap();
    assert_eq!(
        m.run_candidate(attempt, &mut admin, "c", "2", VALUES, None)
            .await,
        -1
    );
    let owner: Option<String> = admin.get("{t}:owner").await.unwrap();
    assert_eq!(owner, None, "c did not lead without its value");
    let queue: Vec<String> = admin.lrange("{t}:queue", 0, -1).await.unwrap();
    assert!(queue.is_empty(), "c's place is gone: {queue:?}");

    // Joining again with its value, it leads with it.
    assert_eq!(
        m.run_candidate(attempt, &mut admin, "c", "1", VALUES, Some("c"))
            .await,
        3
    );
    let value: Option<String> = admin.get("{t}:v:c").await.unwrap();
    assert_eq!(value.as_deref(), Some("c"));
}
