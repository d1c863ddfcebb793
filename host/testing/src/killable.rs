//! A ledger file that can be killed as a process is: every write before the kill reaches the file
//! (the page cache outlives a killed process), and none after it, not even the close that would
//! make pending writes durable. So a crash loses what a real one loses: on redb, an effect's
//! answer still riding with the next durable commit.

use std::fs::OpenOptions;
use std::io;
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

/// redb's own file backend, refusing every write once `killed` is set.
#[derive(Debug)]
pub(crate) struct Killable {
    file: FileBackend,
    killed: Arc<AtomicBool>,
}

impl Killable {
    pub(crate) fn open(path: &Path, killed: Arc<AtomicBool>) -> io::Result<Killable> {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        Ok(Killable { file: FileBackend::new(file).map_err(io::Error::other)?, killed })
    }

    fn alive(&self) -> io::Result<()> {
        match self.killed.load(Ordering::SeqCst) {
            true => Err(io::Error::other("the harness killed this host")),
            false => Ok(()),
        }
    }
}

impl StorageBackend for Killable {
    fn len(&self) -> Result<u64, io::Error> {
        self.file.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.file.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.alive()?;
        self.file.set_len(len)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.alive()?;
        self.file.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.alive()?;
        self.file.write(offset, data)
    }

    /// Releases the file's locks, killed or not: the next host opens the file at once.
    fn close(&self) -> Result<(), io::Error> {
        self.file.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.try_lock_range(start, end)
    }

    fn try_lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.query_lock_range(start, end)
    }
}
