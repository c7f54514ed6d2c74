//! `distlock holders`: who holds a lock, who waits for it.

use std::io::Write;
use std::time::Duration;

use distlock::etcd::{EtcdContender, EtcdLockProvider, EtcdStrategy};
use distlock::memory::MemoryServer;
use distlock::redis::{RedisHolders, RedisLockProvider, RedisStrategy};
use distlock::zookeeper::{Contender, ZkLockProvider};
use distlock::{BackendConfig, LockError, LockName};
use serde_json::{Value, json};

use crate::cli_run::{Connection, hosts};
use crate::{failure_status, report};

pub(crate) async fn holders(url: &str, name: &str, json: bool) -> u8 {
    match look(url, name).await {
        Ok(view) => {
            let text = if json {
                view.json().to_string()
            } else {
                view.text()
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

/// What the backend records for one lock.
enum View {
    ZooKeeper {
        name: String,
        path: String,
        contenders: Vec<Contender>,
    },
    Redis {
        name: String,
        strategy: RedisStrategy,
        holders: RedisHolders,
    },
    Memory {
        name: String,
        holder: Option<u64>,
        waiters: usize,
    },
    Etcd {
        name: String,
        strategy: EtcdStrategy,
        contenders: Vec<EtcdContender>,
    },
}

async fn look(url: &str, name: &str) -> Result<View, LockError> {
    let lock_name = LockName::new(name)?;
    let name = name.to_owned();
    match BackendConfig::from_url(url)? {
        BackendConfig::ZooKeeper(config) => {
            let path = format!("{}/{}", config.root, lock_name.escaped());
            let provider = ZkLockProvider::connect(config)
                .await
                .map_err(connecting(url))?;
            let contenders = provider.contenders(&name).await;
            Connection::from_zookeeper(provider).close().await;
            Ok(View::ZooKeeper {
                name,
                path,
                contenders: contenders?,
            })
        }
        BackendConfig::Redis(config) => {
            let strategy = config.strategy;
            let provider = RedisLockProvider::connect(config)
                .await
                .map_err(connecting(url))?;
            let holders = provider.holders(&name).await;
            Connection::from_provider(provider).close().await;
            Ok(View::Redis {
                name,
                strategy,
                holders: holders?,
            })
        }
        BackendConfig::Memory(config) => {
            let server = match &config.server {
                Some(server) => MemoryServer::named(server),
                None => MemoryServer::new(),
            };
            let provider = server.provider_in(&config.namespace);
            Ok(View::Memory {
                holder: provider.holder(&name)?.map(|token| token.0),
                waiters: provider.waiters(&name)?,
                name,
            })
        }
        BackendConfig::Etcd(config) => {
            let strategy = config.strategy;
            let provider = EtcdLockProvider::connect(config)
                .await
                .map_err(connecting(url))?;
            let contenders = provider.contenders(&name).await;
            Connection::from_provider(provider).close().await;
            Ok(View::Etcd {
                name,
                strategy,
                contenders: contenders?,
            })
        }
        other => Err(LockError::Unsupported {
            backend: other.backend(),
            what: "listing holders (ask each server with a redis:// URL)".to_owned(),
        }),
    }
}

impl View {
    fn json(&self) -> Value {
        match self {
            View::ZooKeeper {
                name,
                path,
                contenders,
            } => {
                let entry = |contender: &Contender| {
                    json!({
                        "node": contender.node,
                        "sequence": contender.sequence,
                        "session": format!("{:#x}", contender.session_id),
                        "czxid": contender.czxid,
                        "fencing_token": contender.fencing_token().0,
                    })
                };
                json!({
                    "backend": "zookeeper",
                    "name": name,
                    "path": path,
                    "holder": contenders.first().map(entry),
                    "waiters": contenders.iter().skip(1).map(entry).collect::<Vec<_>>(),
                })
            }
            View::Redis {
                name,
                strategy,
                holders,
            } => json!({
                "backend": "redis",
                "name": name,
                "strategy": strategy.as_str(),
                "holder": holders.owner.as_ref().map(|owner| json!({
                    "owner": owner,
                    "ttl_ms": holders.owner_ttl.map(|ttl| u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)),
                    "fencing_token": holders.fence,
                })),
                "waiters": holders.queue.iter().map(|owner| json!({ "owner": owner })).collect::<Vec<_>>(),
                "waiters_recorded": *strategy == RedisStrategy::Queue,
            }),
            View::Memory {
                name,
                holder,
                waiters,
            } => json!({
                "backend": "memory",
                "name": name,
                "holder": holder.map(|token| json!({ "fencing_token": token })),
                "waiters": (1..=*waiters).map(|position| json!({ "position": position })).collect::<Vec<_>>(),
                "note": MEMORY_NOTE,
            }),
            View::Etcd {
                name,
                strategy,
                contenders,
            } => {
                let entry = |contender: &EtcdContender| {
                    json!({
                        "key": contender.key,
                        "lease": format!("{:x}", contender.lease),
                        "create_revision": contender.create_revision,
                        "fencing_token": contender.fencing_token().0,
                    })
                };
                json!({
                    "backend": "etcd",
                    "name": name,
                    "strategy": strategy.as_str(),
                    "holder": contenders.first().map(entry),
                    "waiters": contenders.iter().skip(1).map(entry).collect::<Vec<_>>(),
                    "waiters_recorded": *strategy != EtcdStrategy::Single,
                })
            }
        }
    }

    fn text(&self) -> String {
        let mut lines = Vec::new();
        match self {
            View::ZooKeeper {
                name,
                path,
                contenders,
            } => {
                lines.push(format!("lock {name:?} on zookeeper, directory {path}"));
                if contenders.is_empty() {
                    lines.push("free: nobody holds it or waits for it".to_owned());
                }
                for (index, contender) in contenders.iter().enumerate() {
                    let role = match index {
                        0 => "holder".to_owned(),
                        n => format!("waiter {n}"),
                    };
                    lines.push(format!(
                        "{role:<9} {}  session {:#x}  czxid {}{}",
                        contender.node,
                        contender.session_id,
                        contender.czxid,
                        if index == 0 {
                            " (its fencing token)"
                        } else {
                            ""
                        },
                    ));
                }
            }
            View::Redis {
                name,
                strategy,
                holders,
            } => {
                lines.push(format!("lock {name:?} on redis, {strategy} strategy"));
                match &holders.owner {
                    Some(owner) => lines.push(format!(
                        "holder    owner {owner}  fencing token {}{}",
                        holders.fence,
                        holders
                            .owner_ttl
                            .map(|ttl| format!("  lease {} left", short(ttl)))
                            .unwrap_or_default()
                    )),
                    None => lines.push("free: nobody holds it".to_owned()),
                }
                for (index, owner) in holders.queue.iter().enumerate() {
                    lines.push(format!(
                        "{:<9} owner {owner}",
                        format!("waiter {}", index + 1)
                    ));
                }
                if *strategy != RedisStrategy::Queue {
                    lines.push(format!(
                        "(the {strategy} strategy keeps no queue on the server: waiters are not listed)"
                    ));
                }
            }
            View::Memory {
                name,
                holder,
                waiters,
            } => {
                lines.push(format!("lock {name:?} on memory"));
                match holder {
                    Some(token) => lines.push(format!("holder    fencing token {token}")),
                    None => lines.push("free: nobody holds it".to_owned()),
                }
                for position in 1..=*waiters {
                    lines.push(format!("waiter {position}"));
                }
                lines.push(format!("({MEMORY_NOTE})"));
            }
            View::Etcd {
                name,
                strategy,
                contenders,
            } => {
                lines.push(format!("lock {name:?} on etcd, {strategy} strategy"));
                if contenders.is_empty() {
                    lines.push("free: nobody holds it or waits for it".to_owned());
                }
                for (index, contender) in contenders.iter().enumerate() {
                    let role = if index == 0 {
                        "holder".to_owned()
                    } else {
                        format!("waiter {index}")
                    };
                    let token = if index == 0 {
                        " (its fencing token)"
                    } else {
                        ""
                    };
                    lines.push(format!(
                        "{role:<9} {}  lease {:x}  create revision {}{token}",
                        contender.key, contender.lease, contender.create_revision,
                    ));
                }
                if *strategy == EtcdStrategy::Single {
                    lines.push("(the single-key strategy records no waiters)".to_owned());
                }
            }
        }
        lines.join("\n")
    }
}

const MEMORY_NOTE: &str = "only this process's own view: the in-memory backend does not reach \
                           across processes, so another process's locks are never shown";

/// A duration rounded to milliseconds, for display.
fn short(duration: Duration) -> String {
    humantime::format_duration(Duration::from_millis(
        u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
    ))
    .to_string()
}
