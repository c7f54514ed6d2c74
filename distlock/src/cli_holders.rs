//! `distlock holders`: who holds a lock, who waits for it — lock-core's
//! [`LockQueue`], which every backend fills alike.

use std::io::Write;
use std::time::Duration;

use distlock::queue::{LockQueue, QueuedContender};
use distlock::{BackendConfig, LockError, LockName};
use serde_json::{Value, json};

use crate::cli_run::{Connection, hosts};
use crate::{failure_status, report};

pub(crate) async fn holders(url: &str, name: &str, json: bool) -> u8 {
    match look(url, name).await {
        Ok((backend, queue)) => {
            let text = if json {
                to_json(backend, name, &queue).to_string()
            } else {
                to_text(backend, name, &queue)
            };
            // A closed stdout (`| head`) is not an error worth reporting.
            let _ = writeln!(std::io::stdout().lock(), "{text}");
            0
        }
        Err(error) => {
            report(&error);
            failure_status(&error)
        }
    }
}

/// Connection errors name the servers that were asked.
fn connecting(url: &str) -> impl FnOnce(LockError) -> LockError + '_ {
    move |error| match error {
        LockError::Connection {
            backend,
            name,
            message,
            source,
        } => LockError::Connection {
            backend,
            name,
            message: format!("{message} (connecting to {})", hosts(url)),
            source,
        },
        other => other,
    }
}

/// The backend's name and the lock's queue, read with a provider of its own that is
/// closed again before this returns.
async fn look(url: &str, name: &str) -> Result<(&'static str, LockQueue), LockError> {
    LockName::new(name)?;
    let config = BackendConfig::from_url(url)?;
    let backend = config.backend();
    if let BackendConfig::Redlock(_) = config {
        // Refused before any server is asked: a Redlock lock has no one queue to show.
        return Err(LockError::Unsupported {
            backend,
            what: "listing holders (ask each server with a redis:// URL)".to_owned(),
        });
    }
    let connection = Connection::open(config).await.map_err(connecting(url))?;
    let queue = match connection.provider.lock(name) {
        Ok(lock) => lock.queue().await,
        Err(error) => Err(error),
    };
    connection.close().await;
    Ok((backend, queue?))
}

fn to_json(backend: &str, name: &str, queue: &LockQueue) -> Value {
    json!({
        "backend": backend,
        "name": name,
        "location": queue.location,
        "holder": queue.holder().map(entry_json),
        "waiters": queue.waiters().map(entry_json).collect::<Vec<_>>(),
        "waiters_recorded": queue.waiters_recorded,
        "note": queue.note,
    })
}

/// A contender as JSON: its place, session, token and lease, and the backend's details
/// (numbers as numbers).
fn entry_json(contender: &QueuedContender) -> Value {
    let mut entry = json!({
        "place": contender.place,
        "session": contender.session,
        "fencing_token": contender.fencing_token.map(|token| token.0),
        "lease_left_ms": contender.lease_left.map(|left| u64::try_from(left.as_millis()).unwrap_or(u64::MAX)),
    });
    if let Value::Object(fields) = &mut entry {
        for (detail, value) in &contender.details {
            let value = value
                .parse::<i64>()
                .map_or_else(|_| json!(value), |number| json!(number));
            fields.insert((*detail).to_owned(), value);
        }
    }
    entry
}

fn to_text(backend: &str, name: &str, queue: &LockQueue) -> String {
    let mut lines = vec![match &queue.location {
        Some(location) => format!("lock {name:?} on {backend}, at {location}"),
        None => format!("lock {name:?} on {backend}"),
    }];
    if queue.holder().is_none() {
        lines.push(
            match queue.waiters().next() {
                Some(_) => "free: nobody holds it",
                None => "free: nobody holds it or waits for it",
            }
            .to_owned(),
        );
    }
    let roles = queue.contenders.iter().scan(0, |waiters, contender| {
        Some(if contender.holds {
            "holder".to_owned()
        } else {
            *waiters += 1;
            format!("waiter {waiters}")
        })
    });
    for (role, contender) in roles.zip(&queue.contenders) {
        lines.push(format!("{role:<9} {}", entry_text(contender)));
    }
    if let Some(note) = &queue.note {
        lines.push(format!("({note})"));
    }
    lines.join("\n")
}

fn entry_text(contender: &QueuedContender) -> String {
    let mut parts = Vec::new();
    parts.extend(contender.place.clone());
    parts.extend(contender.session.as_ref().map(|s| format!("session {s}")));
    parts.extend(
        contender
            .fencing_token
            .map(|token| format!("fencing token {}", token.0)),
    );
    parts.extend(
        contender
            .lease_left
            .map(|left| format!("lease {} left", short(left))),
    );
    parts.extend(
        contender
            .details
            .iter()
            .map(|(detail, value)| format!("{} {value}", detail.replace('_', " "))),
    );
    parts.join("  ")
}

/// A duration rounded to milliseconds, for display.
fn short(duration: Duration) -> String {
    humantime::format_duration(Duration::from_millis(
        u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
    ))
    .to_string()
}
