//! An active-passive pair on a leader election: one worker leads and works, the other waits
//! its turn; an observer follows who leads.
//!
//! ```text
//! cargo run -p distlock --example election                        # in-memory backend
//! cargo run -p distlock --features zookeeper --example election -- zk://127.0.0.1:2181/app
//! ```

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "an example shows on the terminal what it does"
)]

use std::sync::Arc;
use std::time::Duration;

use distlock::{Election, FencingToken, LockError};

#[tokio::main]
async fn main() -> Result<(), LockError> {
    // Two workers, each its own client (its own session), as two processes would be. The
    // in-memory server is named so that both connections reach the same one.
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://election-example".to_owned());
    let (host_a, host_b) = (
        distlock::connect(&url).await?,
        distlock::connect(&url).await?,
    );
    let (election_a, election_b) = (
        host_a.election("billing/worker")?,
        host_b.election("billing/worker")?,
    );

    // Anyone can follow the leader: every change, or the latest of changes that come
    // faster than it reads them (a backend that polls may not see a short leadership).
    let mut leaders = Arc::clone(&election_a).observe().await?;
    let observer = tokio::spawn(async move {
        while let Ok(leader) = leaders.changed().await {
            match leader {
                Some(leader) => {
                    println!(
                        "observer: {} leads in term {}",
                        leader.value_lossy(),
                        leader.term
                    );
                }
                None => println!("observer: nobody leads"),
            }
        }
    });

    let (a_leads, leading) = tokio::sync::oneshot::channel();
    let a = tokio::spawn(active_passive(election_a, "host-a", 3, Some(a_leads)));
    // host-b campaigns once host-a leads: it waits in line behind it.
    let _ = leading.await;
    let b = tokio::spawn(active_passive(election_b, "host-b", 2, None));
    for worker in [a, b] {
        worker
            .await
            .map_err(|e| LockError::other("example", e.to_string()))??;
    }
    observer.abort();
    Ok(())
}

/// Waits to lead (and says so on `leads`), then works until done (and resigns, handing over
/// at once) or until the leadership is lost (and stops at once: another worker may lead by
/// now).
async fn active_passive(
    election: Arc<dyn Election>,
    host: &'static str,
    rounds: u32,
    leads: Option<tokio::sync::oneshot::Sender<()>>,
) -> Result<(), LockError> {
    let mut leadership = election.campaign(host.as_bytes(), None).await?;
    let term = leadership.term();
    println!("{host}: leading in term {term}");
    if let Some(leads) = leads {
        let _ = leads.send(());
    }
    let lost = leadership.lost();
    tokio::select! {
        reason = lost.wait() => {
            println!("{host}: leadership lost ({reason:?})");
            Ok(())
        }
        () = work(host, term, rounds) => {
            leadership.resign().await?;
            println!("{host}: resigned");
            Ok(())
        }
    }
}

/// The leader's work; every write carries the term, which fences out an older leader.
async fn work(host: &str, term: FencingToken, rounds: u32) {
    for round in 1..=rounds {
        tokio::time::sleep(Duration::from_millis(30)).await;
        println!("{host}: round {round} of work in term {term}");
    }
}
