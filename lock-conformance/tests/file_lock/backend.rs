//! A file lock, written from lock-core's docs alone: one file per lock name in a directory,
//! held with `flock`, its content the last fencing token handed out.
//! Waiters poll with back-off.
//!
//! The provider is the session: the files it holds locked are its grants, and they are
//! unlocked when it is dropped, as the operating system unlocks them when a process dies.
//! Lock files stay on disk (deleting one would let two clients lock two different files
//! of the same name); what the "server" records is the kernel's lock table.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use lock_core::kit::{MutexAttempt, Wakeups};
use lock_core::observe::observe_lock;
use rustix::fs::{FlockOperation, flock};

use lock_core::{
    Capabilities, Deadline, DistributedLock, Fencing, FencingToken, Guard, GuardBackend, LockError,
    LockName, LockProvider, LossReason, LostNotifier, Metrics, MetricsSnapshot, WaitKind,
    async_trait, lost_signal,
};

const BACKEND: &str = "file";
const SUFFIX: &str = ".lock";
/// File names are limited to 255 bytes.
const MAX_KEY_LEN: usize = 255 - SUFFIX.len();
/// A waiter's first pause between tries, doubled up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(5);
const LONGEST_PAUSE: Duration = Duration::from_millis(50);

/// One client of the file lock: a session over one directory.
#[derive(Debug)]
pub(crate) struct FileLockProvider {
    session: Arc<Session>,
}

#[derive(Debug)]
struct Session {
    dir: PathBuf,
    /// The locked files of the grants this session holds.
    held: Mutex<HashMap<u64, Held>>,
    /// Counts abrupt ends; a waiter that started before one gives up.
    ends: AtomicU64,
    next_grant: AtomicU64,
    metrics: Arc<Metrics>,
}

#[derive(Debug)]
struct Held {
    /// Locked; closing it unlocks.
    _file: File,
    lost: LostNotifier,
}

impl FileLockProvider {
    /// A client of the locks in `dir`, which is created if missing.
    pub(crate) fn open(dir: impl Into<PathBuf>) -> Result<Self, LockError> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|e| io_error(None, &e))?;
        Ok(FileLockProvider {
            session: Arc::new(Session {
                dir,
                held: Mutex::default(),
                ends: AtomicU64::new(0),
                next_grant: AtomicU64::new(0),
                metrics: Arc::new(Metrics::new()),
            }),
        })
    }

    /// The file that stands for the lock `name` in `dir`.
    pub(crate) fn path_of(dir: &Path, name: &LockName) -> Result<PathBuf, LockError> {
        let key = name
            .escaped_within(MAX_KEY_LEN)
            .ok_or_else(|| io_error(Some(name), &io::Error::other("no file name fits")))?;
        Ok(dir.join(format!("{key}{SUFFIX}")))
    }

    /// Ends the session abruptly, as the death of the process would: every file it holds is
    /// closed, and so unlocked. Its guards are not told (a release finds out); its waiters
    /// give up.
    pub(crate) fn end_abruptly(&self) {
        let mut held = self.session.held();
        self.session.ends.fetch_add(1, Ordering::SeqCst);
        let ended = std::mem::take(&mut *held);
        drop(held);
        // Their notifiers go unfired: the loss was not noticed.
        drop(ended);
    }
}

impl LockProvider for FileLockProvider {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        // The kernel unlocks a dead process's files at once. Nothing else takes a lock
        // away, so there is no loss to detect; the counter file survives restarts.
        Capabilities::new(WaitKind::Poll)
            .with_fencing(Fencing::Monotonic)
            .with_crash_release_bound(Some(Duration::ZERO))
    }

    fn lock(&self, name: &str) -> Result<Arc<dyn DistributedLock>, LockError> {
        let name = LockName::new(name)?;
        let path = Self::path_of(&self.session.dir, &name)?;
        let lock = Arc::new(FileLock {
            session: Arc::downgrade(&self.session),
            metrics: Arc::clone(&self.session.metrics),
            name,
            path,
        });
        // Acquisitions, waits, holds and losses recorded as every backend records them.
        Ok(observe_lock(lock, "file", "poll"))
    }

    fn metrics(&self) -> MetricsSnapshot {
        self.session.metrics.snapshot()
    }
}

impl Session {
    fn held(&self) -> MutexGuard<'_, HashMap<u64, Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One try: the guard if the file was free. Synchronous, so a dropped `acquire` never
    /// leaves a grant half made. `ends` is the count of abrupt ends when the attempt began:
    /// a grant after another end would outlive the session it was asked for.
    fn try_lock(
        self: &Arc<Self>,
        name: &LockName,
        path: &Path,
        ends: u64,
    ) -> Result<Option<Guard>, LockError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| io_error(Some(name), &e))?;
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
            Err(errno) => return Err(io_error(Some(name), &errno.into())),
        }
        let mut file = file;
        // An error from here on closes the file, which unlocks it.
        let token = next_token(&mut file).map_err(|e| io_error(Some(name), &e))?;
        let (notifier, signal) = lost_signal();
        let grant = self.next_grant.fetch_add(1, Ordering::Relaxed);
        let mut held = self.held();
        if self.ends.load(Ordering::SeqCst) != ends {
            // Ended while we locked the file: closing it gives the lock up.
            return Err(session_expired(name));
        }
        held.insert(
            grant,
            Held {
                _file: file,
                lost: notifier,
            },
        );
        drop(held);
        self.metrics.record_grant();
        let backend = FileGuard {
            session: Arc::downgrade(self),
            grant,
            name: name.clone(),
        };
        Ok(Some(Guard::new(
            name.clone(),
            FencingToken(token),
            signal,
            Box::new(backend),
        )))
    }
}

impl Drop for Session {
    /// The provider was closed: its grants end, and their guards learn it.
    fn drop(&mut self) {
        let held = std::mem::take(self.held.get_mut().unwrap_or_else(PoisonError::into_inner));
        for (_, grant) in held {
            grant.lost.fire(LossReason::SessionExpired);
        }
    }
}

/// Reads the last token from the locked file and writes the next one over it. Tokens only
/// grow, so the new number is never shorter than the old one and covers it.
fn next_token(file: &mut File) -> io::Result<u64> {
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    let last = match text.trim() {
        "" => 0,
        digits => digits
            .parse::<u64>()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?,
    };
    let next = last
        .checked_add(1)
        .ok_or_else(|| io::Error::other("the fencing counter is exhausted"))?;
    file.seek(SeekFrom::Start(0))?;
    file.write_all(next.to_string().as_bytes())?;
    file.sync_data()?;
    Ok(next)
}

fn io_error(name: Option<&LockName>, error: &io::Error) -> LockError {
    let error = LockError::other(BACKEND, error.to_string());
    match name {
        Some(name) => error.for_lock(name),
        None => error,
    }
}

fn session_expired(name: &LockName) -> LockError {
    LockError::session_expired(BACKEND).for_lock(name)
}

#[derive(Debug)]
struct FileLock {
    /// Lock handles do not keep the session alive.
    session: Weak<Session>,
    metrics: Arc<Metrics>,
    name: LockName,
    path: PathBuf,
}

impl FileLock {
    fn session(&self) -> Result<Arc<Session>, LockError> {
        self.session
            .upgrade()
            .ok_or_else(|| session_expired(&self.name))
    }
}

/// The algorithm: try to lock the file; while it is busy, poll with back-off. The kit
/// makes `try_acquire` (one try) and `acquire` (the timeout error) of it.
#[async_trait]
impl MutexAttempt for FileLock {
    fn name(&self) -> &LockName {
        &self.name
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn attempt(&self, deadline: Deadline) -> Result<Option<Guard>, LockError> {
        let ends = self.session()?.ends.load(Ordering::SeqCst);
        let mut wakeups = Wakeups::new(&self.metrics);
        let mut pause = FIRST_PAUSE;
        loop {
            // Not held across the pause: a closed provider ends the wait.
            let session = self.session()?;
            if session.ends.load(Ordering::SeqCst) != ends {
                return Err(session_expired(&self.name));
            }
            if let Some(guard) = session.try_lock(&self.name, &self.path, ends)? {
                return Ok(Some(guard));
            }
            wakeups.busy();
            if deadline.is_immediate() || deadline.has_passed() {
                return Ok(None);
            }
            drop(session);
            let nap = deadline.remaining().map_or(pause, |left| left.min(pause));
            tokio::time::sleep(nap).await;
            pause = (pause * 2).min(LONGEST_PAUSE);
            wakeups.woke();
        }
    }
}

#[derive(Debug)]
struct FileGuard {
    session: Weak<Session>,
    grant: u64,
    name: LockName,
}

impl FileGuard {
    /// Takes this grant's file out of the session, if the session still holds it.
    fn take(&self) -> Option<Held> {
        self.session.upgrade()?.held().remove(&self.grant)
    }
}

#[async_trait]
impl GuardBackend for FileGuard {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// Conditional by construction: it closes only this grant's own file. A grant whose
    /// session ended is gone, and the lock may be someone else's now.
    async fn release(&mut self) -> Result<(), LockError> {
        match self.take() {
            Some(_closed) => Ok(()),
            None => Err(LockError::lost(
                BACKEND,
                &self.name,
                LossReason::SessionExpired,
            )),
        }
    }

    fn release_on_drop(self: Box<Self>) {
        drop(self.take());
    }
}
