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
            .arg("")
            .arg(queue);
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
