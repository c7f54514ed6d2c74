//! The contenders of an etcd mutex as its directory shows them: for
//! [`EtcdLockProvider::contenders`](crate::EtcdLockProvider::contenders) and, in lock-core's
//! terms, [`DistributedLock::queue`](lock_core::DistributedLock::queue).

use etcd_client::{GetOptions, SortOrder, SortTarget};
use lock_core::queue::{LockQueue, QueuedContender};
use lock_core::{FencingToken, LockError};

use crate::config::EtcdStrategy;
use crate::queue::Place;

/// A contender of an etcd lock, as [`EtcdLockProvider::contenders`](crate::EtcdLockProvider::contenders) finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdContender {
    /// The key.
    pub key: String,
    /// The lease the key hangs on: the contender's session.
    pub lease: i64,
    /// The key's create revision: its place in the queue.
    pub create_revision: i64,
}

impl EtcdContender {
    /// The fencing token this contender holds (or will hold): its create revision.
    pub fn fencing_token(&self) -> FencingToken {
        FencingToken(u64::try_from(self.create_revision).unwrap_or_default())
    }
}

impl Place {
    /// The directory's keys in create-revision order, read in one request at one revision.
    pub(crate) async fn contenders(&self) -> Result<Vec<EtcdContender>, LockError> {
        let session = self.shared.session(&self.name).await?;
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let mut kv = session.client.kv_client();
        let found = session
            .ask(self.name.as_str(), kv.get(&*self.dir, Some(options)))
            .await?;
        Ok(found
            .kvs()
            .iter()
            .map(|kv| EtcdContender {
                key: String::from_utf8_lossy(kv.key()).into_owned(),
                lease: kv.lease(),
                create_revision: kv.create_revision(),
            })
            .collect())
    }

    /// The contenders as lock-core's [`LockQueue`]: the first holds.
    pub(crate) async fn queue(&self) -> Result<LockQueue, LockError> {
        let contenders = self.contenders().await?;
        let listed = contenders.iter().enumerate().map(|(index, contender)| {
            QueuedContender::new(index == 0, Some(contender.key.clone()))
                .with_session(format!("{:x}", contender.lease))
                .with_fencing_token(contender.fencing_token())
                .with_detail("create_revision", contender.create_revision)
        });
        let queue = LockQueue::new(listed.collect()).at(self.dir.to_string());
        Ok(match self.strategy {
            EtcdStrategy::Single => queue
                .without_recorded_waiters()
                .with_note("the single-key strategy records no waiters"),
            _ => queue,
        })
    }
}
