//! The whole suite against a backend from outside the workspace: a file lock (see
//! `backend.rs`), plugged in as the crate docs say. It is the example to copy for a backend
//! of your own: a harness of a client per call, the session expiry every harness must
//! offer, a restart (for the fencing counter's survival, E4), and an inspector, so that it
//! passes under `LOCK_CONFORMANCE_STRICT=1`.
#![allow(
    clippy::expect_used,
    reason = "a test harness fails the test when it cannot start"
)]

mod backend;

use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex, Weak};

use backend::FileLockProvider;
use lock_conformance::{
    Client, Entries, FaultError, FaultResult, Faults, Harness, Inspector, LockKind, SessionExpiry,
    async_trait,
};
use lock_core::{LockError, LockName};

/// Every test gets a directory of its own.
struct FileHarness {
    dir: tempfile::TempDir,
    /// Every client made, for a restart.
    clients: Mutex<Vec<Weak<FileLockProvider>>>,
}

impl FileHarness {
    fn new() -> Self {
        FileHarness {
            dir: tempfile::tempdir().expect("a temporary directory"),
            clients: Mutex::new(Vec::new()),
        }
    }

    fn client_in(&self, namespace: &str) -> Result<Client, LockError> {
        let provider = Arc::new(FileLockProvider::open(self.dir.path().join(namespace))?);
        let session = Arc::new(ProcessDeath(Arc::downgrade(&provider)));
        self.clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Arc::downgrade(&provider));
        Ok(Client::new(provider, session))
    }
}

/// Ends a client's session the way its process's death would.
struct ProcessDeath(Weak<FileLockProvider>);

#[async_trait]
impl SessionExpiry for ProcessDeath {
    async fn expire_session(&self) -> FaultResult {
        let provider = self.0.upgrade().ok_or_else(|| {
            FaultError::Failed("the client was dropped before its session ended".into())
        })?;
        provider.end_abruptly();
        Ok(())
    }
}

#[async_trait]
impl Harness for FileHarness {
    async fn client(&self) -> Result<Client, LockError> {
        self.client_in("locks")
    }

    fn faults(&self) -> Option<&dyn Faults> {
        Some(self)
    }

    fn inspector(&self) -> Option<&dyn Inspector> {
        Some(self)
    }

    async fn client_in_other_namespace(&self) -> Option<Result<Client, LockError>> {
        Some(self.client_in("other-locks"))
    }
}

/// The "server" is the kernel and the file system.
#[async_trait]
impl Faults for FileHarness {
    /// A reboot, as the clients see it: the kernel drops every lock of every process, and
    /// the files (the lock files and their fencing counters) stay. The clients go on, as
    /// new processes after a reboot would, in the same directory.
    async fn restart_server(&self) -> FaultResult {
        let clients = self
            .clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        clients
            .iter()
            .filter_map(Weak::upgrade)
            .for_each(|provider| provider.end_abruptly());
        Ok(())
    }
}

/// The kernel keeps the locks: its lock table (`/proc/locks`) lists every `flock` with the
/// process that holds it and the file's inode.
#[async_trait]
impl Inspector for FileHarness {
    async fn entries(&self, name: &str) -> Result<Entries, LockError> {
        let name = LockName::new(name)?;
        let path = FileLockProvider::path_of(&self.dir.path().join("locks"), &name)?;
        let Ok(file) = std::fs::metadata(&path) else {
            return Ok(Entries::new(0, 0));
        };
        let table = std::fs::read_to_string("/proc/locks")
            .map_err(|e| LockError::other("file", format!("reading /proc/locks: {e}")))?;
        let pid = std::process::id().to_string();
        let inode = format!(":{}", file.ino());
        let holders = table
            .lines()
            .map(|line| line.split_whitespace().collect::<Vec<_>>())
            .filter(|fields| {
                // "1: FLOCK  ADVISORY  WRITE 4242 00:23:1234 0 EOF"
                fields.get(1) == Some(&"FLOCK")
                    && fields.get(4) == Some(&pid.as_str())
                    && fields.get(5).is_some_and(|id| id.ends_with(&inode))
            })
            .count();
        Ok(Entries::new(holders, 0))
    }

    /// Waiters poll: they leave nothing in the lock table.
    fn records_waiters(&self, _kind: LockKind) -> bool {
        false
    }
}

lock_conformance::conformance_tests!(FileHarness::new());
