//! The fenced register: a counter that accepts a write only with a fencing token not lower
//! than the last one it accepted (Kleppmann's fenced storage), and logs every write.
//!
//! It lives outside the lock's backend, in the process that runs the chaos, and clients
//! reach it over loopback TCP with a line protocol:
//!
//! | request | reply |
//! | --- | --- |
//! | `READ` | `VALUE <value>` |
//! | `WRITE <client> <token> <value>` | `OK`, or `STALE <highest token accepted>` |
//!
//! Reads do not move the highest token: the register fences writes only, so an increment
//! whose read and write straddle another holder's write is lost, and the checker counts it.
//! That is the lock's failure to exclude, which fencing alone does not hide.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What the register did with a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "verdict")]
#[non_exhaustive]
pub enum Verdict {
    /// Its token was not lower than any accepted before: the value is now the written one.
    Accepted,
    /// Its token was lower than `highest`, the highest accepted so far: nothing changed.
    Rejected {
        /// The highest token accepted before this write.
        highest: u64,
    },
}

/// One write as the register saw it, in the order it saw them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RegisterWrite {
    /// The client that sent it.
    pub client: u32,
    /// Its fencing token.
    pub token: u64,
    /// The value it would set.
    pub value: u64,
    /// What the register did with it.
    pub verdict: Verdict,
}

/// The register's state: its value, the highest token it accepted, and its log.
///
/// ```
/// use lock_chaos::{FencedRegister, Verdict};
///
/// let mut register = FencedRegister::new();
/// assert_eq!(register.write(1, 7, 1), Verdict::Accepted);
/// assert_eq!(register.write(2, 5, 2), Verdict::Rejected { highest: 7 });
/// assert_eq!(register.value(), 1);
/// ```
#[derive(Debug, Default, Clone)]
pub struct FencedRegister {
    value: u64,
    highest: Option<u64>,
    log: Vec<RegisterWrite>,
}

impl FencedRegister {
    /// A register holding 0 that has accepted nothing.
    pub fn new() -> Self {
        FencedRegister::default()
    }

    /// The current value.
    pub fn value(&self) -> u64 {
        self.value
    }

    /// The highest token accepted so far.
    pub fn highest(&self) -> Option<u64> {
        self.highest
    }

    /// Sets the value to `value` if `token` is not lower than every token accepted before.
    pub fn write(&mut self, client: u32, token: u64, value: u64) -> Verdict {
        let verdict = match self.highest {
            Some(highest) if token < highest => Verdict::Rejected { highest },
            _ => {
                self.highest = Some(token);
                self.value = value;
                Verdict::Accepted
            }
        };
        self.log.push(RegisterWrite {
            client,
            token,
            value,
            verdict,
        });
        verdict
    }

    /// Every write, in the order the register saw them.
    pub fn log(&self) -> &[RegisterWrite] {
        &self.log
    }
}

/// A [`FencedRegister`] served on a loopback port; stops when dropped.
#[derive(Debug)]
pub struct RegisterServer {
    address: SocketAddr,
    state: Arc<Mutex<FencedRegister>>,
    task: JoinHandle<()>,
}

impl RegisterServer {
    /// Serves a new register on a free loopback port.
    ///
    /// # Errors
    ///
    /// When no port can be bound.
    pub async fn start() -> io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let address = listener.local_addr()?;
        let state = Arc::new(Mutex::new(FencedRegister::new()));
        let task = tokio::spawn(serve(listener, Arc::clone(&state)));
        Ok(RegisterServer {
            address,
            state,
            task,
        })
    }

    /// Where clients connect.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// A copy of the register as it is now.
    pub fn snapshot(&self) -> FencedRegister {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for RegisterServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(listener: TcpListener, state: Arc<Mutex<FencedRegister>>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(serve_one(stream, Arc::clone(&state)));
            }
            Err(error) => tracing::debug!(%error, "register: accept failed"),
        }
    }
}

async fn serve_one(stream: TcpStream, state: Arc<Mutex<FencedRegister>>) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let reply = answer(&line, &state);
        if write.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// The reply to one request line, newline included.
fn answer(line: &str, state: &Mutex<FencedRegister>) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut register = state.lock().unwrap_or_else(PoisonError::into_inner);
    match words.as_slice() {
        ["READ"] => format!("VALUE {}\n", register.value()),
        ["WRITE", client, token, value] => match (client.parse(), token.parse(), value.parse()) {
            (Ok(client), Ok(token), Ok(value)) => match register.write(client, token, value) {
                Verdict::Accepted => "OK\n".to_owned(),
                Verdict::Rejected { highest } => format!("STALE {highest}\n"),
            },
            _ => "ERR numbers expected: WRITE <client> <token> <value>\n".to_owned(),
        },
        _ => "ERR unknown request; READ or WRITE <client> <token> <value>\n".to_owned(),
    }
}

/// Why a register request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterError {
    /// The connection failed; the request may or may not have been applied.
    #[error("register connection: {0}")]
    Io(#[from] io::Error),
    /// The register closed the connection before replying.
    #[error("the register closed the connection")]
    Closed,
    /// A reply that is not in the protocol.
    #[error("unexpected reply from the register: {0:?}")]
    Protocol(String),
}

/// A connection to a [`RegisterServer`].
#[derive(Debug)]
pub struct RegisterClient {
    replies: tokio::io::Lines<BufReader<OwnedReadHalf>>,
    requests: OwnedWriteHalf,
}

impl RegisterClient {
    /// Connects to the register at `address`.
    ///
    /// # Errors
    ///
    /// When the connection fails.
    pub async fn connect(address: SocketAddr) -> Result<Self, RegisterError> {
        let (read, requests) = TcpStream::connect(address).await?.into_split();
        Ok(RegisterClient {
            replies: BufReader::new(read).lines(),
            requests,
        })
    }

    async fn ask(&mut self, request: &str) -> Result<String, RegisterError> {
        self.requests.write_all(request.as_bytes()).await?;
        self.replies.next_line().await?.ok_or(RegisterError::Closed)
    }

    /// The register's value.
    ///
    /// # Errors
    ///
    /// As [`RegisterError`].
    pub async fn read(&mut self) -> Result<u64, RegisterError> {
        let reply = self.ask("READ\n").await?;
        reply
            .strip_prefix("VALUE ")
            .and_then(|value| value.parse().ok())
            .ok_or(RegisterError::Protocol(reply))
    }

    /// Writes `value` with `token` on behalf of `client`.
    ///
    /// # Errors
    ///
    /// As [`RegisterError`]; after [`RegisterError::Io`] the write's fate is unknown.
    pub async fn write(
        &mut self,
        client: u32,
        token: u64,
        value: u64,
    ) -> Result<Verdict, RegisterError> {
        let reply = self
            .ask(&format!("WRITE {client} {token} {value}\n"))
            .await?;
        if reply == "OK" {
            return Ok(Verdict::Accepted);
        }
        reply
            .strip_prefix("STALE ")
            .and_then(|highest| highest.parse().ok())
            .map(|highest| Verdict::Rejected { highest })
            .ok_or(RegisterError::Protocol(reply))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_tokens_pass_lower_ones_do_not() {
        let mut register = FencedRegister::new();
        assert_eq!(register.write(1, 3, 1), Verdict::Accepted);
        assert_eq!(register.write(1, 3, 2), Verdict::Accepted);
        assert_eq!(register.write(2, 2, 9), Verdict::Rejected { highest: 3 });
        assert_eq!(register.write(3, 4, 3), Verdict::Accepted);
        assert_eq!((register.value(), register.highest()), (3, Some(4)));
        assert_eq!(register.log().len(), 4);
        assert_eq!(register.log()[2].verdict, Verdict::Rejected { highest: 3 });
    }

    #[tokio::test]
    async fn clients_reach_the_register_over_loopback() {
        let server = RegisterServer::start().await.unwrap();
        assert!(server.address().ip().is_loopback());
        let mut a = RegisterClient::connect(server.address()).await.unwrap();
        let mut b = RegisterClient::connect(server.address()).await.unwrap();
        assert_eq!(a.read().await.unwrap(), 0);
        assert_eq!(a.write(1, 10, 1).await.unwrap(), Verdict::Accepted);
        assert_eq!(
            b.write(2, 9, 1).await.unwrap(),
            Verdict::Rejected { highest: 10 }
        );
        assert_eq!(b.read().await.unwrap(), 1);
        let snapshot = server.snapshot();
        assert_eq!(snapshot.value(), 1);
        assert_eq!(snapshot.log().len(), 2);
    }

    #[test]
    fn bad_requests_get_an_error_line() {
        let state = Mutex::new(FencedRegister::new());
        assert!(answer("WRITE 1 x 2", &state).starts_with("ERR"));
        assert!(answer("DELETE", &state).starts_with("ERR"));
        assert!(state.lock().unwrap().log().is_empty());
    }
}
