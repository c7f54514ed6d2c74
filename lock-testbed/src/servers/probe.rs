//! Raw-socket conversations with the servers: ZooKeeper four-letter words, a minimal RESP
//! exchange for Redis, and HTTP/1.0 `GET` for etcd; and asking again until they answer.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpStream, ToSocketAddrs};
use tokio::time::Instant;

use super::ServerError;

/// `look`'s answer once it gives one, asking every `interval`; once `deadline` has passed,
/// why not, as `look` last said.
pub(crate) async fn ask_until<T, F: Future<Output = Result<T, String>>>(
    deadline: Instant,
    interval: Duration,
    mut look: impl FnMut() -> F,
) -> Result<T, String> {
    loop {
        let why = match look().await {
            Ok(found) => return Ok(found),
            Err(why) => why,
        };
        if Instant::now() >= deadline {
            return Err(why);
        }
        tokio::time::sleep(interval).await;
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
