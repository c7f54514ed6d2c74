//! The mechanics every server shares: ports, program lookup, process groups, the
//! exit watchdog, log files, bounded readiness.

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tempfile::TempDir;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::ServerError;
use super::spec::{self, Peer, Probe, ServerSpec, Site};

/// Ports handed out by [`free_port`] in this process, and where it looks next.
static PORTS: Mutex<Ports> = Mutex::new(Ports {
    handed_out: BTreeSet::new(),
    next: None,
});

struct Ports {
    /// Never handed out twice, so that two servers started at the same moment, or one
    /// restarted on its port, never meet another server of this process there.
    handed_out: BTreeSet<u16>,
    /// The next port to try, from a random start in [`server_ports`].
    next: Option<u16>,
}

/// How many ports [`free_port`] takes its ports from, at most.
const SERVER_PORT_SPAN: u16 = 16_384;

/// The ports that [`free_port`] hands out: those just below the kernel's range for the source
/// ports of outgoing connections (`ip_local_port_range`, 32768 and up by default). A port in
/// that range can be taken by any client's connection while its server is down for a restart
/// (it happened to a ZooKeeper member's election port); below it, only another server can.
fn server_ports() -> std::ops::Range<u16> {
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    ephemeral_start.saturating_sub(SERVER_PORT_SPAN).max(1_024)..ephemeral_start
}

/// The file whose bytes stand for ports: a process that hands a port out locks its byte
/// (an open file description lock, gone when the process ends), so that processes starting
/// servers side by side never hand out the same port, even while its server is down. One
/// file per user: another user's file in a shared temporary directory cannot be opened.
static RESERVATIONS: LazyLock<Option<File>> = LazyLock::new(|| {
    let path = reservations_path();
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .inspect_err(|error| {
            warn!(%error, path = %path.display(), "ports are not reserved across processes");
        })
        .ok()
});

fn reservations_path() -> PathBuf {
    let user = nix::unistd::Uid::current();
    std::env::temp_dir().join(format!("distlock-test-ports-{user}.lock"))
}

/// Reserves `port` for this process: `false` if another process holds it. Without the
/// reservations file, or where the file cannot be locked, every port is taken as free.
fn reserve(port: u16) -> bool {
    let Some(file) = RESERVATIONS.as_ref() else {
        return true;
    };
    match nix::fcntl::fcntl(file, nix::fcntl::FcntlArg::F_OFD_SETLK(&port_lock(port))) {
        Ok(_) => true,
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => false,
        Err(error) => {
            debug!(%error, port, "a port could not be reserved across processes");
            true
        }
    }
}

/// A write lock on `port`'s byte of the reservations file.
fn port_lock(port: u16) -> nix::libc::flock {
    nix::libc::flock {
        l_type: nix::libc::F_WRLCK as nix::libc::c_short,
        l_whence: nix::libc::SEEK_SET as nix::libc::c_short,
        l_start: nix::libc::off_t::from(port),
        l_len: 1,
        l_pid: 0,
    }
}

/// A free TCP port on 127.0.0.1 for a server: one that binds now, just below the range the
/// kernel takes outgoing connections' source ports from (`ip_local_port_range`), taken in
/// turn from a random start, and reserved against the other processes of this user that
/// start servers (a lock on the port's byte of a file in the temporary directory).
///
/// Never returns the same port twice in one process, nor a port another such process has
/// handed out. Another program may still take the port before the server binds it; that
/// race is accepted (the start-up then fails with the server's own "address in use" in the
/// log).
pub fn free_port() -> Result<u16, ServerError> {
    let mut ports = PORTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let range = server_ports();
    if range.len() < 1_000 {
        return any_free_port(&mut ports.handed_out);
    }
    let mut next = ports
        .next
        .filter(|port| range.contains(port))
        .unwrap_or_else(|| fastrand::u16(range.clone()));
    for _ in 0..range.len() {
        let port = next;
        next = if next + 1 >= range.end {
            range.start
        } else {
            next + 1
        };
        if ports.handed_out.contains(&port)
            || TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_err()
            || !reserve(port)
        {
            continue;
        }
        ports.handed_out.insert(port);
        ports.next = Some(next);
        return Ok(port);
    }
    Err(ServerError::Io(std::sync::Arc::new(std::io::Error::other(
        format!("no free port on 127.0.0.1 in {range:?}"),
    ))))
}

/// A free port the kernel picks (binding port 0), for a machine whose range of source ports
/// leaves no room below it.
fn any_free_port(handed_out: &mut BTreeSet<u16>) -> Result<u16, ServerError> {
    for _ in 0..100 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let port = listener.local_addr()?.port();
        drop(listener);
        if handed_out.insert(port) {
            return Ok(port);
        }
    }
    Err(ServerError::Io(std::sync::Arc::new(std::io::Error::other(
        "no new free port on 127.0.0.1 after 100 attempts",
    ))))
}

/// The loopback socket address for `port`.
pub(crate) fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// Looks a program up like a shell would: a name with a `/` is a path, a bare name is
/// searched in `PATH`. Returns the executable's path if it exists.
pub(crate) fn find_program(program: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        p.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if program.components().count() > 1 || program.is_absolute() {
        return executable(program).then(|| program.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| executable(candidate))
}

/// [`find_program`], or [`ServerError::NotInstalled`] naming `package`.
pub(crate) fn require_program(
    what: &str,
    program: &Path,
    package: &str,
) -> Result<PathBuf, ServerError> {
    find_program(program).ok_or_else(|| {
        let detail = if program.components().count() > 1 || program.is_absolute() {
            format!("{what} not found: {} is missing", program.display())
        } else {
            format!(
                "{what} not found: no executable `{}` in PATH",
                program.display()
            )
        };
        ServerError::NotInstalled {
            package: package.to_owned(),
            detail,
        }
    })
}

/// Runs a future to completion on a fresh current-thread runtime in a scoped thread, so it
/// works from synchronous code and from inside another runtime alike.
pub(crate) fn block_on<F>(fut: F) -> Result<F::Output, ServerError>
where
    F: Future + Send,
    F::Output: Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                Ok(rt.block_on(fut))
            })
            .join()
            .unwrap_or_else(|_| {
                Err(ServerError::Io(std::sync::Arc::new(std::io::Error::other(
                    "the thread running the server start-up panicked",
                ))))
            })
    })
}

/// The last `max` bytes (at most) of a file.
fn read_tail(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(max)))?;
    let mut buf = Vec::new();
    file.read_to_end(&mut buf)?;
    Ok(buf)
}

/// The last lines (at most `lines`, at most 8 KiB) of a log file, for error messages.
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    match read_tail(path, 8 * 1024) {
        Ok(buf) => {
            let text = String::from_utf8_lossy(&buf);
            let all: Vec<&str> = text.lines().collect();
            let tail = all[all.len().saturating_sub(lines)..].join("\n");
            if tail.is_empty() {
                format!("(the log {} is empty)", path.display())
            } else {
                tail
            }
        }
        Err(err) => format!("(could not read the log {}: {err})", path.display()),
    }
}

/// How many times a start is tried with fresh ports when the server reports its port taken
/// (another process can take a [`free_port`] before the server binds it).
const PORT_CLASH_ATTEMPTS: usize = 3;

/// Runs `attempt` (given its number, from 1) until it succeeds, fails for another reason
/// than a taken port (the `bool` of its error says whether the port was taken), or has
/// found a port taken [`PORT_CLASH_ATTEMPTS`] times. Each attempt after the first is
/// expected to pick fresh ports.
pub(crate) async fn retry_port_clash<T, F>(
    server: &str,
    mut attempt: impl FnMut(usize) -> F,
) -> Result<T, ServerError>
where
    F: Future<Output = Result<T, (ServerError, bool)>>,
{
    let mut attempts = 0;
    loop {
        attempts += 1;
        match attempt(attempts).await {
            Ok(started) => return Ok(started),
            Err((err, true)) if attempts < PORT_CLASH_ATTEMPTS => {
                warn!(attempt = attempts, %err, "{server}: a port was taken; retrying on fresh ports");
            }
            Err((err, _)) => return Err(err),
        }
    }
}

/// True when the log's last 64 KiB mention `needle` (ASCII case-insensitive).
pub(crate) fn log_contains(path: &Path, needle: &str) -> bool {
    read_tail(path, 64 * 1024)
        .map(|buf| {
            String::from_utf8_lossy(&buf)
                .to_ascii_lowercase()
                .contains(&needle.to_ascii_lowercase())
        })
        .unwrap_or(false)
}

/// `n` free loopback ports.
pub(crate) fn free_ports(n: usize) -> Result<Vec<u16>, ServerError> {
    (0..n).map(|_| free_port()).collect()
}

/// Member `index` of `members` as a process of the kind `spec` in `dir` (which exists),
/// called `server` in messages: its files written, ready to spawn.
pub(crate) fn spec_instance<S: ServerSpec>(
    spec: &S,
    server: String,
    dir: &Path,
    index: usize,
    members: &[Peer],
) -> Result<Instance, ServerError> {
    let dir_text = dir.display().to_string();
    let site = Site {
        index,
        bind: "127.0.0.1",
        dir: &dir_text,
        members,
        in_container: false,
    };
    let spec::Command { argv, files } = spec.command(&site)?;
    for (path, text) in files {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, text)?;
    }
    let mut argv = argv.into_iter();
    let launch = Launch {
        program: argv.next().unwrap_or_default().into(),
        args: argv.map(Into::into).collect(),
        cwd: dir.to_path_buf(),
    };
    let addr = loopback(site.port(0));
    let log = dir.join("server.log");
    Ok(Instance::new(
        server,
        launch,
        log,
        addr,
        spec.probe(),
        spec.startup_timeout(),
    ))
}

/// How to launch a server process.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    /// The resolved executable.
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<OsString>,
    pub(crate) cwd: PathBuf,
}

/// A `/bin/sh` running a clean-up script (`$1` = its argument) once a pipe that only this
/// process writes closes: when the watchdog is dropped (then waited for), or when the test
/// process ends without dropping it (a process-wide static, an abort, `SIGKILL`).
/// [`disarm`](Self::disarm) ends it without running the script.
#[derive(Debug)]
pub(crate) struct Watchdog {
    what: &'static str,
    arg: String,
    process: Option<(Child, ChildStdin)>,
}

impl Watchdog {
    /// Starts it; without `/bin/sh` it does nothing (with a warning).
    pub(crate) fn spawn(script: &str, what: &'static str, arg: impl AsRef<OsStr>) -> Self {
        let arg = arg.as_ref();
        // The pipe's write end is close-on-exec: no other child inherits it.
        let spawned = Command::new("/bin/sh")
            .arg("-c")
            .arg(script)
            .arg("lock-testbed-watchdog")
            .arg(arg)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn();
        let arg = arg.to_string_lossy().into_owned();
        let process = match spawned {
            Ok(mut watchdog) => match watchdog.stdin.take() {
                Some(pipe) => Some((watchdog, pipe)),
                None => {
                    let _ = watchdog.kill();
                    let _ = watchdog.wait();
                    None
                }
            },
            Err(err) => {
                warn!(%what, %arg, %err, "no exit watchdog: it outlives an aborted test process");
                None
            }
        };
        Self { what, arg, process }
    }

    /// Ends the watchdog without running its script (the owner cleaned up itself).
    pub(crate) fn disarm(&mut self) {
        if let Some((mut watchdog, pipe)) = self.process.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
            drop(pipe);
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some((mut watchdog, pipe)) = self.process.take() {
            // End of input: the script cleans up now; wait for it.
            drop(pipe);
            if !watchdog.wait().is_ok_and(|status| status.success()) {
                warn!(what = %self.what, arg = %self.arg, "the watchdog could not clean up");
            }
        }
    }
}

/// The watchdog script of a server process: kill the server's process group (`$1`).
const KILL_SCRIPT: &str = "read -r _ignored; kill -s KILL -- \"-$1\" 2>/dev/null; exit 0";

/// The watchdog script of a [`ScratchDir`]: remove the directory (`$1`). A server being
/// killed at the same moment may still add a file while `rm` walks the tree, so a failed
/// removal is tried once more a second later.
const REMOVE_SCRIPT: &str =
    "read -r _ignored; rm -rf -- \"$1\" 2>/dev/null || { sleep 1; rm -rf -- \"$1\"; }; exit 0";

/// A temporary directory (named `prefix…`) for servers' data and logs, removed when
/// dropped and also when the test process ends without dropping it (a process-wide
/// static, an abort): etcd preallocates 64 MB write-ahead-log segments, so every leaked
/// directory would cost real disk.
#[derive(Debug)]
pub(crate) struct ScratchDir {
    dir: TempDir,
    watchdog: Watchdog,
}

impl ScratchDir {
    pub(crate) fn new(prefix: &str) -> Result<Self, ServerError> {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir()?;
        let watchdog = Watchdog::spawn(REMOVE_SCRIPT, "directory", dir.path());
        Ok(Self { dir, watchdog })
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        // The directory is removed here, by `TempDir`, right after.
        self.watchdog.disarm();
    }
}

/// A running server process, leader of its own process group, with its watchdog.
///
/// Dropping it kills the watchdog, then the process group (`SIGKILL`), and reaps.
#[derive(Debug)]
pub(crate) struct Proc {
    child: Child,
    watchdog: Watchdog,
    exited: Option<ExitStatus>,
}

impl Proc {
    /// Spawns `launch` in a new process group with stdout and stderr appended to `log`, then
    /// its watchdog.
    pub(crate) fn spawn(server: &str, launch: &Launch, log: &Path) -> Result<Self, ServerError> {
        let mut log_file = OpenOptions::new().create(true).append(true).open(log)?;
        writeln!(
            log_file,
            "--- lock-testbed: launching {server}: {} {}",
            launch.program.display(),
            launch
                .args
                .iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" ")
        )?;
        let stderr = log_file.try_clone()?;
        let child = Command::new(&launch.program)
            .args(&launch.args)
            .current_dir(&launch.cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log_file))
            .stderr(Stdio::from(stderr))
            .process_group(0)
            .spawn()?;
        let pid = child.id();
        info!(server, pid, program = %launch.program.display(), "spawned server");
        Ok(Self {
            child,
            watchdog: Watchdog::spawn(KILL_SCRIPT, "server process", pid.to_string()),
            exited: None,
        })
    }

    /// The server's pid (also its process-group id).
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    fn pgid(&self) -> Result<Pid, ServerError> {
        i32::try_from(self.child.id())
            .map(Pid::from_raw)
            .map_err(|_| std::io::Error::other("pid out of range").into())
    }

    /// Sends `signal` to the whole process group.
    pub(crate) fn signal_group(&self, signal: Signal) -> Result<(), ServerError> {
        if self.exited.is_some() {
            return Err(std::io::Error::other("the server process has already exited").into());
        }
        killpg(self.pgid()?, signal)?;
        Ok(())
    }

    /// `Some(status)` once the server process has exited (reaping it).
    pub(crate) fn try_exited(&mut self) -> Result<Option<ExitStatus>, ServerError> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait()?;
        }
        Ok(self.exited)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // The watchdog goes first so it cannot act on a recycled group id later.
        self.watchdog.disarm();
        let pid = self.child.id();
        if self.exited.is_none() {
            // Not reaped yet, so the group id still belongs to our process group.
            if let Ok(pgid) = self.pgid() {
                // SIGKILL also ends stopped (paused) processes.
                let _ = killpg(pgid, Signal::SIGKILL);
            }
            let _ = self.child.kill();
            match self.child.wait() {
                Ok(status) => debug!(pid, %status, "server process killed and reaped"),
                Err(err) => warn!(pid, %err, "could not reap the server process"),
            }
        }
    }
}

/// One server process with everything needed to (re)start it and wait for it.
#[derive(Debug)]
pub(crate) struct Instance {
    proc: Option<Proc>,
    server: String,
    launch: Launch,
    log: PathBuf,
    addr: SocketAddr,
    probe: Probe,
    startup_timeout: Duration,
}

impl Instance {
    pub(crate) fn new(
        server: impl Into<String>,
        launch: Launch,
        log: PathBuf,
        addr: SocketAddr,
        probe: Probe,
        startup_timeout: Duration,
    ) -> Self {
        Self {
            proc: None,
            server: server.into(),
            launch,
            log,
            addr,
            probe,
            startup_timeout,
        }
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub(crate) fn log_path(&self) -> &Path {
        &self.log
    }

    /// True when `err` is a start-up failure and the log says an address was in use: worth
    /// another attempt on fresh ports.
    pub(crate) fn port_clash(&self, err: &ServerError) -> bool {
        matches!(err, ServerError::Startup { .. }) && log_contains(&self.log, "already in use")
    }

    /// The pid of the running process, if any.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(Proc::pid)
    }

    /// Launches the process (killing a previous one first) without waiting for readiness.
    pub(crate) fn spawn(&mut self) -> Result<(), ServerError> {
        self.kill();
        self.proc = Some(Proc::spawn(&self.server, &self.launch, &self.log)?);
        Ok(())
    }

    /// Launches the process and waits (bounded by the start-up timeout) until it serves.
    pub(crate) async fn start(&mut self) -> Result<Duration, ServerError> {
        let began = Instant::now();
        self.spawn()?;
        self.wait_ready(Instant::now() + self.startup_timeout)
            .await?;
        let took = began.elapsed();
        info!(server = %self.server, addr = %self.addr, ?took, "server ready");
        Ok(took)
    }

    /// Kills the process if running, starts it again (same ports, same directory) and waits
    /// until it serves, bounded by the start-up timeout.
    pub(crate) async fn restart(&mut self) -> Result<(), ServerError> {
        let took = self.start().await?;
        info!(port = self.addr.port(), ?took, "{} restarted", self.server);
        Ok(())
    }

    /// Kills the process and reaps it (no-op when not running): first the sessions it
    /// started, its leader frozen meanwhile so that it starts no more, then its process
    /// group. A server process left over (PostgreSQL's are sessions of their own) would
    /// hold what a restarted server must find free, such as shared memory.
    pub(crate) fn kill(&mut self) {
        if let Some(proc) = self.proc.take() {
            info!(server = %self.server, pid = proc.pid(), "killing server");
            if proc.signal_group(Signal::SIGSTOP).is_ok() {
                let children = children_of(proc.pid());
                signal_all(&children, Signal::SIGKILL);
                // An exited process that is not yet reaped (a zombie) holds nothing.
                let deadline = Instant::now() + Duration::from_secs(5);
                while children.iter().any(|pid| runs(*pid)) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            drop(proc);
        }
    }

    /// Sends `signal` to the process group and to the sessions its leader started (each
    /// of PostgreSQL's server processes is one, out of reach of a signal to the group):
    /// the leader first when stopping (it starts no more), last when continuing. `SIGSTOP`
    /// returns once every thread of the server is stopped (bounded by 2 s): the signal
    /// takes effect asynchronously, and a busy machine can leave a thread running long
    /// enough to answer one more request.
    pub(crate) fn signal(&self, signal: Signal) -> Result<(), ServerError> {
        let Some(proc) = &self.proc else {
            return Err(ServerError::NotRunning {
                server: self.server.clone(),
            });
        };
        debug!(server = %self.server, pid = proc.pid(), ?signal, "signalling server");
        if signal == Signal::SIGCONT {
            signal_all(&children_of(proc.pid()), signal);
        }
        proc.signal_group(signal)?;
        if signal != Signal::SIGCONT {
            signal_all(&children_of(proc.pid()), signal);
        }
        if signal == Signal::SIGSTOP {
            wait_until_stopped(proc.pid(), Duration::from_secs(2));
        }
        Ok(())
    }

    /// What a failure message should say of the server: whether its process runs, is
    /// frozen or has exited (as `/proc` shows it), and the last lines of its log.
    pub(crate) fn condition(&self) -> String {
        let state = match self.pid() {
            None => "does not run (killed by the test)".to_owned(),
            Some(pid) => match stat_of(pid) {
                Some(('Z', _)) => format!("(pid {pid}) has exited"),
                Some(('T' | 't', _)) => format!("(pid {pid}) is stopped"),
                Some((state, _)) => format!("(pid {pid}) runs, in state {state}"),
                None => format!("(pid {pid}) has exited and been reaped"),
            },
        };
        format!(
            "{} {state}; the last lines of its log:\n{}",
            self.server,
            log_tail(&self.log, 20)
        )
    }

    fn startup_error(&self, detail: String) -> ServerError {
        ServerError::Startup {
            server: self.server.clone(),
            detail,
            log_tail: log_tail(&self.log, 20),
        }
    }

    /// Probes until the server serves, its process exits, or `deadline` passes (then the
    /// process is killed).
    pub(crate) async fn wait_ready(&mut self, deadline: Instant) -> Result<(), ServerError> {
        let began = Instant::now();
        let Some(proc) = self.proc.as_mut() else {
            return Err(ServerError::NotRunning {
                server: self.server.clone(),
            });
        };
        let exited = async {
            loop {
                if let Some(status) = proc.try_exited()? {
                    return Ok::<_, ServerError>(status);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let last = tokio::select! {
            ready = self.probe.wait(self.addr, deadline) => match ready {
                Ok(()) => return Ok(()),
                Err(last) => last,
            },
            status = exited => {
                let status = status?;
                self.proc = None;
                let detail = format!("the process exited during start-up ({status})");
                return Err(self.startup_error(detail));
            }
        };
        let err = self.startup_error(format!(
            "not ready on {} after {:?} (bound {:?}); last probe: {last}",
            self.addr,
            began.elapsed(),
            self.startup_timeout
        ));
        self.kill();
        Err(err)
    }
}

/// The state letter of process `pid` in `/proc/<pid>/stat`, and its parent; `None` once it
/// is gone.
fn stat_of(pid: u32) -> Option<(char, u32)> {
    state_and_parent(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The state letter and the parent of a process or thread, from its `stat` text: they
/// follow the command name's closing parenthesis (a name may hold spaces and parentheses).
fn state_and_parent(stat: &str) -> Option<(char, u32)> {
    let mut rest = stat.rsplit_once(") ")?.1.split_whitespace();
    let state = rest.next()?.chars().next()?;
    Some((state, rest.next()?.parse().ok()?))
}

/// Whether process `pid` runs (it exists and is not a zombie).
fn runs(pid: u32) -> bool {
    stat_of(pid).is_some_and(|(state, _)| state != 'Z')
}

/// The processes whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| stat_of(*pid).is_some_and(|(_, ppid)| ppid == parent))
        .collect()
}

/// Sends `signal` to each of `pids` (one that exited meanwhile has nothing to receive it).
fn signal_all(pids: &[u32], signal: Signal) {
    for pid in pids {
        if let Ok(pid) = i32::try_from(*pid) {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), signal);
        }
    }
}

/// Waits (at most `bound`) until every thread of process `pid` is stopped, as `/proc` tells.
fn wait_until_stopped(pid: u32, bound: Duration) {
    let stopped = || {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return true;
        };
        tasks.flatten().all(|task| {
            std::fs::read_to_string(task.path().join("stat"))
                .ok()
                .and_then(|stat| state_and_parent(&stat))
                .is_none_or(|(state, _)| matches!(state, 'T' | 't' | 'Z' | 'X'))
        })
    };
    let deadline = std::time::Instant::now() + bound;
    while !stopped() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_handed_out_is_below_the_source_ports_and_reserved_against_other_processes() {
        let port = free_port().unwrap();
        assert!(
            server_ports().contains(&port),
            "{port} not in {:?}",
            server_ports()
        );
        // Another open file description of the reservations file stands for another
        // process: the port's byte is locked against it.
        let other = OpenOptions::new()
            .read(true)
            .write(true)
            .open(reservations_path())
            .unwrap();
        let taken = nix::fcntl::fcntl(&other, nix::fcntl::FcntlArg::F_OFD_SETLK(&port_lock(port)));
        assert!(taken.is_err(), "port {port} was not reserved");
        assert_ne!(free_port().unwrap(), port);
    }
}
