//! A read-write lock (readers share, a writer is alone) and a semaphore (at most N holders).
//!
//! ```text
//! cargo run -p distlock --example rw_and_semaphore                # in-memory backend
//! cargo run -p distlock --features redis --example rw_and_semaphore -- redis://127.0.0.1:6379
//! ```

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "an example shows on the terminal what it does"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use distlock::LockError;

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".to_owned());
    let locks = distlock::connect(&url).await?;

    // Three readers of the catalogue hold the lock together; a writer waits for all of them.
    let catalogue = locks.rw_lock("catalogue")?;
    let mut readers = Vec::new();
    for _ in 0..3 {
        readers.push(catalogue.read(Some(Duration::from_secs(5))).await?);
    }
    println!("3 readers hold the catalogue at once");
    if catalogue.try_write().await?.is_some() {
        return Err(LockError::other(
            "example",
            "a writer got in beside the readers",
        ));
    }
    let writing = {
        let catalogue = Arc::clone(&catalogue);
        tokio::spawn(async move { catalogue.write(Some(Duration::from_secs(5))).await })
    };
    for mut reader in readers {
        reader.release().await?;
    }
    let mut writer = writing
        .await
        .map_err(|e| LockError::other("example", e.to_string()))??;
    println!(
        "the writer holds it alone, token {}",
        writer.fencing_token()
    );
    writer.release().await?;

    // Five jobs share two export slots: never more than two run at once.
    let slots = locks.semaphore("exports", 2)?;
    let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let jobs: Vec<_> = (0..5)
        .map(|job| {
            let (slots, running, most) =
                (Arc::clone(&slots), Arc::clone(&running), Arc::clone(&most));
            tokio::spawn(async move {
                let mut permit = slots.acquire(Some(Duration::from_secs(10))).await?;
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                println!("  job {job} exports ({now} running)");
                tokio::time::sleep(Duration::from_millis(30)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                permit.release().await
            })
        })
        .collect();
    for job in jobs {
        job.await
            .map_err(|e| LockError::other("example", e.to_string()))??;
    }
    let most = most.load(Ordering::SeqCst);
    println!("5 jobs done, at most {most} at once");
    if most > 2 {
        return Err(LockError::other(
            "example",
            "more jobs than slots ran at once",
        ));
    }
    Ok(())
}
