//! Raw-socket conversations with the servers: ZooKeeper four-letter words, a minimal RESP
//! exchange for Redis, and HTTP/1.0 `GET /health` for etcd.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpStream, ToSocketAddrs};

use super::ServerError;

/// How a server is checked for readiness.
#[derive(Debug, Clone)]
pub(crate) enum Probe {
    /// ZooKeeper serves requests: `srvr` contains `Mode:`.
    ZkServing,
    /// Redis answers `PING` with `PONG` (after `AUTH` with the default user's password).
    RedisPing { password: Option<String> },
    /// etcd's `GET /health` says `"health":"true"`.
    EtcdHealth,
    /// PostgreSQL answers a start-up message with an authentication request, not with an
    /// error (such as "the database system is starting up").
    PostgresStartup,
}

impl Probe {
    /// The pause between two attempts.
    pub(crate) fn interval(&self) -> Duration {
        match self {
            Self::ZkServing => Duration::from_millis(100),
            Self::RedisPing { .. } => Duration::from_millis(20),
            Self::EtcdHealth => Duration::from_millis(50),
            Self::PostgresStartup => Duration::from_millis(50),
        }
    }

    /// One attempt; `Err` says why the server is not ready (yet).
    pub(crate) async fn check(&self, addr: SocketAddr, timeout: Duration) -> Result<(), String> {
        match self {
            Self::ZkServing => {
                let answer = four_letter(&addr.to_string(), "srvr", timeout)
                    .await
                    .map_err(|e| e.to_string())?;
                if answer.contains("Mode:") {
                    Ok(())
                } else {
                    Err(format!("srvr answered {:?}", answer.trim()))
                }
            }
            Self::RedisPing { password } => redis_ping(addr, password.as_deref(), timeout)
                .await
                .map_err(|e| e.to_string()),
            Self::EtcdHealth => {
                let answer = http_get(addr, "/health", timeout)
                    .await
                    .map_err(|e| e.to_string())?;
                if answer.contains("\"health\":\"true\"") {
                    Ok(())
                } else {
                    Err(format!("GET /health answered {:?}", answer.trim()))
                }
            }
            Self::PostgresStartup => postgres_startup(addr, timeout)
                .await
                .map_err(|e| e.to_string()),
        }
    }
}

async fn bounded<T>(
    what: impl FnOnce() -> String,
    timeout: Duration,
    fut: impl Future<Output = Result<T, ServerError>>,
) -> Result<T, ServerError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(result) => result,
        Err(_) => Err(ServerError::Timeout {
            what: what(),
            after: timeout,
        }),
    }
}

/// Sends `request` on `stream` and reads the answer to end-of-file (as lossy UTF-8).
async fn exchange<S>(mut stream: S, request: &[u8]) -> std::io::Result<String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream.write_all(request).await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// Connects to `addr`, sends `request` and reads the answer to end-of-file, all bounded by
/// `timeout`; `what` names the answer in the [`ServerError::Timeout`].
async fn tcp_exchange(
    addr: impl ToSocketAddrs,
    request: &[u8],
    what: impl FnOnce() -> String,
    timeout: Duration,
) -> Result<String, ServerError> {
    bounded(what, timeout, async {
        let stream = TcpStream::connect(addr).await?;
        Ok(exchange(stream, request).await?)
    })
    .await
}

/// Sends a ZooKeeper four-letter word to `addr` (`host:port`) and reads the answer to EOF.
pub(crate) async fn four_letter(
    addr: &str,
    word: &str,
    timeout: Duration,
) -> Result<String, ServerError> {
    let what = || format!("the answer to `{word}` from ZooKeeper at {addr}");
    tcp_exchange(addr, word.as_bytes(), what, timeout).await
}

/// Encodes a command as a RESP array of bulk strings.
pub(crate) fn resp_command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Sends one command and reads the first line of the reply (enough for `+OK`, `+PONG`
/// and `-ERR ...`).
async fn resp_line(
    stream: &mut BufReader<TcpStream>,
    args: &[&[u8]],
) -> Result<String, ServerError> {
    stream.get_mut().write_all(&resp_command(args)).await?;
    let mut line = String::new();
    let n = stream.read_line(&mut line).await?;
    if n == 0 {
        return Err(ServerError::Protocol {
            server: "Redis".to_owned(),
            detail: "connection closed before a reply".to_owned(),
        });
    }
    Ok(line.trim_end().to_owned())
}

/// `AUTH` (when a password is given) then `PING`, expecting `+OK` and `+PONG`.
pub(crate) async fn redis_ping(
    addr: SocketAddr,
    password: Option<&str>,
    timeout: Duration,
) -> Result<(), ServerError> {
    bounded(|| format!("PONG from Redis at {addr}"), timeout, async {
        let mut stream = BufReader::new(TcpStream::connect(addr).await?);
        if let Some(password) = password {
            let reply = resp_line(&mut stream, &[b"AUTH", password.as_bytes()]).await?;
            if reply != "+OK" {
                return Err(ServerError::Protocol {
                    server: "Redis".to_owned(),
                    detail: format!("AUTH answered {reply:?}"),
                });
            }
        }
        let reply = resp_line(&mut stream, &[b"PING"]).await?;
        if reply == "+PONG" {
            Ok(())
        } else {
            Err(ServerError::Protocol {
                server: "Redis".to_owned(),
                detail: format!("PING answered {reply:?}"),
            })
        }
    })
    .await
}

/// Sends one command (after `AUTH` when a password is given) and reads its reply: a status
/// or an integer as one item, a bulk string as one item (none when nil), or an array of
/// bulk strings, one item each (nested arrays flattened). An error reply is an error.
pub(crate) async fn redis_query(
    addr: SocketAddr,
    password: Option<&str>,
    args: &[&str],
    timeout: Duration,
) -> Result<Vec<String>, ServerError> {
    let what = || format!("the answer to {} from Redis at {addr}", args.join(" "));
    bounded(what, timeout, async {
        let mut stream = BufReader::new(TcpStream::connect(addr).await?);
        if let Some(password) = password {
            let reply = resp_line(&mut stream, &[b"AUTH", password.as_bytes()]).await?;
            if reply != "+OK" {
                return Err(protocol(format!("AUTH answered {reply:?}")));
            }
        }
        let args: Vec<&[u8]> = args.iter().map(|arg| arg.as_bytes()).collect();
        stream.get_mut().write_all(&resp_command(&args)).await?;
        let mut items = Vec::new();
        read_reply(&mut stream, &mut items).await?;
        Ok(items)
    })
    .await
}

fn protocol(detail: String) -> ServerError {
    ServerError::Protocol {
        server: "Redis".to_owned(),
        detail,
    }
}

/// Reads one RESP reply into `items` (see [`redis_query`]).
async fn read_reply(
    stream: &mut BufReader<TcpStream>,
    items: &mut Vec<String>,
) -> Result<(), ServerError> {
    let mut pending = 1_i64;
    while pending > 0 {
        pending -= 1;
        let mut line = String::new();
        if stream.read_line(&mut line).await? == 0 {
            return Err(protocol("connection closed before a reply".to_owned()));
        }
        let line = line.trim_end();
        let (kind, rest) = line.split_at(line.len().min(1));
        let count = || {
            rest.parse::<i64>()
                .map_err(|_| protocol(format!("bad length in {line:?}")))
        };
        match kind {
            "+" | ":" => items.push(rest.to_owned()),
            "-" => return Err(protocol(format!("error reply {rest:?}"))),
            "*" => pending += count()?.max(0),
            "$" => {
                let Ok(len) = usize::try_from(count()?) else {
                    continue; // nil
                };
                let mut bulk = vec![0; len + 2];
                stream.read_exact(&mut bulk).await?;
                bulk.truncate(len);
                items.push(String::from_utf8_lossy(&bulk).into_owned());
            }
            _ => return Err(protocol(format!("unexpected reply {line:?}"))),
        }
    }
    Ok(())
}

/// An HTTP/1.0 GET over a raw socket; returns the whole response (headers and body).
pub(crate) async fn http_get(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<String, ServerError> {
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: */*\r\n\r\n");
    let what = || format!("the answer to GET {path} from {addr}");
    tcp_exchange(addr, request.as_bytes(), what, timeout).await
}

/// Sends PostgreSQL a start-up message (protocol 3.0, user and database `postgres`) and
/// reads the first byte of the answer: `R` (an authentication request, or its success)
/// means the server takes connections.
async fn postgres_startup(addr: SocketAddr, timeout: Duration) -> Result<(), ServerError> {
    let what = || format!("PostgreSQL's answer to a start-up message at {addr}");
    bounded(what, timeout, async {
        let mut body = 196_608_u32.to_be_bytes().to_vec();
        body.extend_from_slice(b"user\0postgres\0database\0postgres\0\0");
        let length = u32::try_from(body.len() + 4).unwrap_or(u32::MAX);
        let mut message = length.to_be_bytes().to_vec();
        message.extend_from_slice(&body);
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(&message).await?;
        let mut first = [0_u8; 1];
        stream.read_exact(&mut first).await?;
        if first[0] == b'R' {
            return Ok(());
        }
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest).await;
        Err(ServerError::from(std::io::Error::other(format!(
            "PostgreSQL is not ready: {}",
            String::from_utf8_lossy(&rest).trim_matches(char::from(0))
        ))))
    })
    .await
}
