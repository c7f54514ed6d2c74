//! `distlock leader`: who leads an election, once or at every change.

use std::io::Write;

use distlock::{BackendConfig, LeaderInfo, LockError, LockName};
use serde_json::{Value, json};

use crate::cli_run::{Connection, Signals, hosts, signal_status};
use crate::{failure_status, report, status};

pub(crate) async fn leader(url: &str, name: &str, watch: bool, json: bool) -> u8 {
    let mut signals = match Signals::new() {
        Ok(signals) => signals,
        Err(error) => {
            report(format_args!("cannot handle signals: {error}"));
            return status::SOFTWARE;
        }
    };
    let config = match LockName::new(name).and_then(|_| BackendConfig::from_url(url)) {
        Ok(config) => config,
        Err(error) => {
            report(&error);
            return failure_status(&error);
        }
    };
    let connection = tokio::select! {
        connected = Connection::open(config) => match connected {
            Ok(connection) => connection,
            Err(error) => {
                report(format_args!("{error} (connecting to {})", hosts(url)));
                return failure_status(&error);
            }
        },
        signal = signals.recv() => return signal_status(signal as i32),
    };
    let code = tokio::select! {
        code = show(&connection, name, watch, json) => code,
        signal = signals.recv() => signal_status(signal as i32),
    };
    connection.close().await;
    code
}

/// Prints the leader, and with `watch` every later one, until the observation fails.
async fn show(connection: &Connection, name: &str, watch: bool, json: bool) -> u8 {
    let printed = async {
        let election = connection.provider.election(name)?;
        if !watch {
            print(name, election.leader().await?.as_ref(), json);
            return Ok::<(), LockError>(());
        }
        let mut leaders = election.observe().await?;
        print(name, leaders.current()?.as_ref(), json);
        loop {
            print(name, leaders.changed().await?.as_ref(), json);
        }
    };
    match printed.await {
        Ok(()) => 0,
        Err(error) => {
            report(&error);
            failure_status(&error)
        }
    }
}

fn print(name: &str, leader: Option<&LeaderInfo>, json: bool) {
    let line = if json {
        let leader = leader.map_or(
            Value::Null,
            |leader| json!({ "value": leader.value_lossy(), "term": leader.term.get() }),
        );
        json!({ "election": name, "leader": leader }).to_string()
    } else {
        match leader {
            Some(leader) => format!("{} (term {})", leader.value_lossy(), leader.term),
            None => "no leader".to_owned(),
        }
    };
    // A closed stdout (`| head`) is not an error worth reporting.
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
