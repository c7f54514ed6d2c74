//! Held keys read again, many in one transaction.
//!
//! A guard whose watch began after the revision at which its key was seen reads the key
//! once more, so that a deletion in between is not missed (see [`crate::guard`]). With
//! many acquisitions in flight on one session nearly every watch begins after other
//! writes, and those reads were a request each: a third of the server's work for a lock
//! taken. Here they queue, and whatever queued while one transaction was out goes in the
//! next, up to [`BATCH`] keys in one read-only transaction.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, GetOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};
use lock_core::Metrics;
use tokio::sync::{mpsc, oneshot};

/// Keys read in one transaction at most: etcd's default `--max-txn-ops`.
const BATCH: usize = 128;

/// A session's reads of held keys, and the task that makes them.
pub(crate) struct KeyReads {
    asks: mpsc::UnboundedSender<Ask>,
}

/// One key to read, and where its answer goes.
struct Ask {
    key: String,
    created: i64,
    known: i64,
    reply: oneshot::Sender<Option<(bool, i64)>>,
}

impl KeyReads {
    /// Starts the task that reads on `client`, each transaction within `timeout`; it ends
    /// when this is dropped.
    pub(crate) fn start(client: Client, metrics: Arc<Metrics>, timeout: Duration) -> KeyReads {
        let (asks, queued) = mpsc::unbounded_channel();
        tokio::spawn(serve(client, metrics, timeout, queued));
        KeyReads { asks }
    }

    /// Whether `key` is gone or is not the one created at revision `created`, and the
    /// revision, no older than `known`, at which that was seen; `None` when no answer came
    /// (the caller tries again later).
    pub(crate) async fn changed(&self, key: &str, created: i64, known: i64) -> Option<(bool, i64)> {
        let (reply, answer) = oneshot::channel();
        let ask = Ask {
            key: key.to_owned(),
            created,
            known,
            reply,
        };
        self.asks.send(ask).ok()?;
        answer.await.ok().flatten()
    }
}

/// Answers what `queued` asks, a batch at a time.
async fn serve(
    client: Client,
    metrics: Arc<Metrics>,
    timeout: Duration,
    mut queued: mpsc::UnboundedReceiver<Ask>,
) {
    while let Some(first) = queued.recv().await {
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match queued.try_recv() {
                Ok(ask) => batch.push(ask),
                Err(_) => break,
            }
        }
        let answer = read(&client, &metrics, timeout, &batch).await;
        let revision = answer
            .as_ref()
            .and_then(TxnResponse::header)
            .map_or(0, |header| header.revision());
        let mut found = answer
            .map(|answer| answer.op_responses())
            .unwrap_or_default()
            .into_iter();
        for ask in batch {
            // Anything but a read's answer (none is expected) tells nothing: asked again.
            let changed = found.next().and_then(|range| match range {
                TxnOpResponse::Get(range) => Some(
                    range
                        .kvs()
                        .first()
                        .is_none_or(|kv| kv.create_revision() != ask.created),
                ),
                _ => None,
            });
            let _ = ask.reply.send(changed.map(|changed| (changed, revision)));
        }
    }
}

/// The keys of `batch`, read at a revision no older than any of them knows: first from
/// the member's applied state (serializable), which spares the leader's read confirmation
/// (a key seen standing at any revision stood at every revision before it since its
/// creation), and linearizably when that member is behind.
async fn read(
    client: &Client,
    metrics: &Metrics,
    timeout: Duration,
    batch: &[Ask],
) -> Option<TxnResponse> {
    let known = batch.iter().map(|ask| ask.known).max().unwrap_or(0);
    let txn = |options: GetOptions| {
        let gets: Vec<TxnOp> = batch
            .iter()
            .map(|ask| TxnOp::get(ask.key.as_str(), Some(options.clone())))
            .collect();
        Txn::new().and_then(gets)
    };
    let mut kv = client.kv_client();
    metrics.record_server_requests(1);
    let serializable = txn(GetOptions::new().with_keys_only().with_serializable());
    let answer = tokio::time::timeout(timeout, kv.txn(serializable))
        .await
        .ok()?
        .ok()?;
    if answer
        .header()
        .is_some_and(|header| header.revision() >= known)
    {
        return Some(answer);
    }
    metrics.record_server_requests(1);
    let linearizable = txn(GetOptions::new().with_keys_only());
    tokio::time::timeout(timeout, kv.txn(linearizable))
        .await
        .ok()?
        .ok()
}
