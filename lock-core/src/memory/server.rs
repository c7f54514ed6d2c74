//! The in-memory server's state machine: who holds what, who waits, and who is next.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{oneshot, watch};

use crate::kit::unpoisoned;
use crate::queue::{LockQueue, QueuedContender};
use crate::{
    FencingToken, LeaderInfo, LockName, LossReason, LostNotifier, LostSignal, lost_signal,
};

/// The kinds of lock live apart: the mutex `x`, the read-write lock `x`, the semaphore `x`
/// and the election `x` are different.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Family {
    Mutex,
    ReadWrite,
    Semaphore,
    Election,
}

/// What a holder or waiter asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Exclusive,
    Read,
    Write,
    Permit,
}

/// A lock's identity on the server: namespace, family and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct LockKey {
    pub(super) namespace: String,
    pub(super) family: Family,
    pub(super) name: LockName,
}

pub(super) struct ServerInner {
    pub(super) name: Option<String>,
    state: Mutex<ServerState>,
}

#[derive(Default)]
pub(super) struct ServerState {
    pub(super) locks: HashMap<LockKey, LockState>,
    pub(super) live_sessions: HashSet<u64>,
    /// Source of session, waiter and holder ids.
    ids: u64,
    /// Server-wide, like ZooKeeper's zxid: strictly increasing for every name at once.
    next_token: u64,
    /// Per observed election, a counter moved on every change of its holders, for the
    /// observers; dropped once nobody observes.
    observed: HashMap<LockKey, watch::Sender<u64>>,
}

pub(super) struct LockState {
    pub(super) holders: Vec<Holder>,
    pub(super) waiters: VecDeque<Waiter>,
    /// 1 except for semaphores.
    pub(super) permits: u32,
}

pub(super) struct Holder {
    pub(super) id: u64,
    session: u64,
    mode: Mode,
    pub(super) token: FencingToken,
    /// An election candidate's value; empty for locks.
    pub(super) value: Arc<[u8]>,
    notifier: LostNotifier,
}

pub(super) struct Waiter {
    id: u64,
    session: u64,
    mode: Mode,
    value: Arc<[u8]>,
    grant: oneshot::Sender<Grant>,
}

pub(super) struct Grant {
    pub(super) id: u64,
    pub(super) token: FencingToken,
    pub(super) lost: LostSignal,
}

/// The outcome of one visit to the server.
pub(super) enum Entry {
    Granted(Grant),
    Busy,
    Queued {
        id: u64,
        grant: oneshot::Receiver<Grant>,
    },
}

/// Why a visit was refused.
pub(super) enum Refusal {
    SessionEnded,
    PermitsMismatch { existing: u32 },
}

pub(super) enum Withdrawal {
    /// Still queued; now removed.
    Removed,
    /// The lock was handed to this waiter.
    Granted,
    /// Neither queued nor holding (the session ended).
    Gone,
}

impl ServerInner {
    pub(super) fn new(name: Option<String>) -> Self {
        ServerInner {
            name,
            state: Mutex::new(ServerState::default()),
        }
    }

    pub(super) fn state(&self) -> MutexGuard<'_, ServerState> {
        unpoisoned(&self.state)
    }

    pub(super) fn open_session(&self) -> u64 {
        let mut state = self.state();
        let id = state.next_id();
        state.live_sessions.insert(id);
        id
    }

    /// Grants `mode` at once if nobody waits and it is compatible with the holders;
    /// otherwise queues (when `queue`) or reports busy.
    pub(super) fn enter(
        &self,
        key: &LockKey,
        session: u64,
        mode: Mode,
        permits: u32,
        value: Arc<[u8]>,
        queue: bool,
    ) -> Result<Entry, Refusal> {
        let mut state = self.state();
        if !state.live_sessions.contains(&session) {
            return Err(Refusal::SessionEnded);
        }
        let id = state.next_id();
        let ServerState {
            locks, next_token, ..
        } = &mut *state;
        let entry = locks.entry(key.clone()).or_insert_with(|| LockState {
            holders: Vec::new(),
            waiters: VecDeque::new(),
            permits,
        });
        if entry.permits != permits {
            let existing = entry.permits;
            forget_if_idle(locks, key);
            return Err(Refusal::PermitsMismatch { existing });
        }
        // FIFO: nobody overtakes a waiter, even when the holders would allow it.
        if entry.waiters.is_empty() && entry.admits(mode) {
            let grant = entry.grant(id, session, mode, value, next_token);
            state.touch(key);
            return Ok(Entry::Granted(grant));
        }
        if !queue {
            forget_if_idle(locks, key);
            return Ok(Entry::Busy);
        }
        let (sender, receiver) = oneshot::channel();
        entry.waiters.push_back(Waiter {
            id,
            session,
            mode,
            value,
            grant: sender,
        });
        Ok(Entry::Queued {
            id,
            grant: receiver,
        })
    }

    /// Frees holder `id`'s grant, if it still holds, and lets the next waiters in.
    pub(super) fn release(&self, key: &LockKey, id: u64) -> bool {
        let mut state = self.state();
        let ServerState {
            locks, next_token, ..
        } = &mut *state;
        let Some(entry) = locks.get_mut(key) else {
            return false;
        };
        let Some(at) = entry.holders.iter().position(|holder| holder.id == id) else {
            return false;
        };
        entry.holders.swap_remove(at);
        entry.admit_waiters(next_token);
        forget_if_idle(locks, key);
        state.touch(key);
        true
    }

    pub(super) fn withdraw(&self, key: &LockKey, id: u64) -> Withdrawal {
        let mut state = self.state();
        let ServerState {
            locks, next_token, ..
        } = &mut *state;
        let Some(entry) = locks.get_mut(key) else {
            return Withdrawal::Gone;
        };
        if let Some(at) = entry.waiters.iter().position(|waiter| waiter.id == id) {
            entry.waiters.remove(at);
            // A writer that gives up may have been all that held back the readers behind it.
            entry.admit_waiters(next_token);
            forget_if_idle(locks, key);
            state.touch(key);
            return Withdrawal::Removed;
        }
        if entry.holders.iter().any(|holder| holder.id == id) {
            Withdrawal::Granted
        } else {
            Withdrawal::Gone
        }
    }

    /// Takes the lock from every holder; returns their tokens.
    pub(super) fn revoke(&self, key: &LockKey) -> Vec<FencingToken> {
        let mut state = self.state();
        let ServerState {
            locks, next_token, ..
        } = &mut *state;
        let Some(entry) = locks.get_mut(key) else {
            return Vec::new();
        };
        let revoked: Vec<_> = entry
            .holders
            .drain(..)
            .map(|holder| {
                holder.notifier.fire(LossReason::Revoked);
                holder.token
            })
            .collect();
        tracing::debug!(lock = %key.name, ?revoked, "memory: holders revoked");
        entry.admit_waiters(next_token);
        forget_if_idle(locks, key);
        state.touch(key);
        revoked
    }

    pub(super) fn end_session(&self, session: u64) {
        let mut state = self.state();
        if !state.live_sessions.remove(&session) {
            return;
        }
        let ServerState {
            locks, next_token, ..
        } = &mut *state;
        for entry in locks.values_mut() {
            // Waiters first, so that a freed lock is never handed to the dying session.
            entry.waiters.retain(|waiter| waiter.session != session);
            entry.holders.retain(|holder| {
                let dying = holder.session == session;
                if dying {
                    holder.notifier.fire(LossReason::SessionExpired);
                }
                !dying
            });
            entry.admit_waiters(next_token);
        }
        locks.retain(|_, entry| !entry.is_idle());
        // Every observer looks again: its own session may be the one that ended.
        let observed: Vec<LockKey> = state.observed.keys().cloned().collect();
        for key in &observed {
            state.touch(key);
        }
        tracing::debug!(session, "memory: session ended");
    }

    /// The first holder of `key`: an election's leader. Refused when `session` has ended.
    pub(super) fn head(&self, key: &LockKey, session: u64) -> Result<Option<LeaderInfo>, Refusal> {
        let state = self.state();
        if !state.live_sessions.contains(&session) {
            return Err(Refusal::SessionEnded);
        }
        Ok(state.locks.get(key).and_then(|entry| {
            entry
                .holders
                .first()
                .map(|holder| LeaderInfo::new(holder.value.to_vec(), holder.token))
        }))
    }

    /// A counter that moves on every change of `key`'s holders (and at every session's end).
    pub(super) fn observe(&self, key: &LockKey) -> watch::Receiver<u64> {
        self.state()
            .observed
            .entry(key.clone())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }
}

impl ServerState {
    pub(super) fn next_id(&mut self) -> u64 {
        self.ids += 1;
        self.ids
    }

    /// Tells `key`'s observers that its holders may have changed; forgets it once nobody
    /// observes.
    fn touch(&mut self, key: &LockKey) {
        if let Some(observers) = self.observed.get(key) {
            if observers.receiver_count() == 0 {
                self.observed.remove(key);
            } else {
                observers.send_modify(|changes| *changes += 1);
            }
        }
    }
}

impl LockState {
    pub(super) fn is_idle(&self) -> bool {
        self.holders.is_empty() && self.waiters.is_empty()
    }

    /// The holders, then the waiters in line, each named by its id on this server.
    pub(super) fn queue(&self) -> LockQueue {
        let holders = self.holders.iter().map(|holder| {
            QueuedContender::holder(format!("#{}", holder.id))
                .with_session(format!("{:x}", holder.session))
                .with_fencing_token(holder.token)
        });
        let waiters = self.waiters.iter().map(|waiter| {
            QueuedContender::waiter(format!("#{}", waiter.id))
                .with_session(format!("{:x}", waiter.session))
        });
        LockQueue::new(holders.chain(waiters).collect())
    }

    /// Whether the current holders allow a grant of `mode`.
    fn admits(&self, mode: Mode) -> bool {
        match mode {
            Mode::Exclusive | Mode::Write => self.holders.is_empty(),
            Mode::Read => self.holders.iter().all(|holder| holder.mode == Mode::Read),
            Mode::Permit => self.holders.len() < self.permits as usize,
        }
    }

    fn grant(
        &mut self,
        id: u64,
        session: u64,
        mode: Mode,
        value: Arc<[u8]>,
        next_token: &mut u64,
    ) -> Grant {
        *next_token += 1;
        let token = FencingToken(*next_token);
        let (notifier, lost) = lost_signal();
        self.holders.push(Holder {
            id,
            session,
            mode,
            token,
            value,
            notifier,
        });
        Grant { id, token, lost }
    }

    /// Grants waiters from the head of the queue while the holders admit them: one writer,
    /// or every reader up to the next writer, or permits while any are left. Waiters whose
    /// `acquire` was dropped are skipped.
    fn admit_waiters(&mut self, next_token: &mut u64) {
        while let Some(head) = self.waiters.front() {
            if !self.admits(head.mode) {
                return;
            }
            let Some(waiter) = self.waiters.pop_front() else {
                return;
            };
            let grant = self.grant(
                waiter.id,
                waiter.session,
                waiter.mode,
                waiter.value,
                next_token,
            );
            if waiter.grant.send(grant).is_err() {
                // Nobody listens any more: undo the grant.
                self.holders.pop();
            }
        }
    }
}

pub(super) fn forget_if_idle(locks: &mut HashMap<LockKey, LockState>, key: &LockKey) {
    if locks.get(key).is_some_and(LockState::is_idle) {
        locks.remove(key);
    }
}
