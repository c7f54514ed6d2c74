//! Short conversations with the servers: ZooKeeper four-letter words and HTTP/1.0 `GET` for
//! etcd over a raw socket, one command to Redis; and asking again until they answer.

use std::net::SocketAddr;
use std::time::Duration;

use redis::{Client, ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
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

/// Sends one command to the Redis server at `addr` (logging in with `password` if given)
/// and returns its reply flattened: a status, an integer or a bulk string one item (nil
/// none), an array or a map item by item. An error reply is an error.
pub(crate) async fn redis_query(
    addr: SocketAddr,
    password: Option<&str>,
    args: &[&str],
    timeout: Duration,
) -> Result<Vec<String>, ServerError> {
    let what = || format!("the answer to {} from Redis at {addr}", args.join(" "));
    bounded(what, timeout, async {
        let [command, args @ ..] = args else {
            return Err(protocol("no command to send"));
        };
        let mut login = RedisConnectionInfo::default().set_skip_set_lib_name();
        if let Some(password) = password {
            login = login.set_password(password);
        }
        let server = ConnectionAddr::Tcp(addr.ip().to_string(), addr.port());
        let client = Client::open(server.into_connection_info()?.set_redis_settings(login))?;
        let mut connection = client.get_multiplexed_async_connection().await?;
        let reply = redis::cmd(command)
            .arg(args)
            .query_async(&mut connection)
            .await?;
        let mut items = Vec::new();
        flatten(reply, &mut items)?;
        Ok(items)
    })
    .await
}

/// Appends the items of `reply` to `items` (see [`redis_query`]).
fn flatten(reply: Value, items: &mut Vec<String>) -> Result<(), ServerError> {
    match reply {
        Value::Nil => {}
        Value::Okay => items.push("OK".to_owned()),
        Value::Int(number) => items.push(number.to_string()),
        Value::SimpleString(text) => items.push(text),
        Value::BulkString(bytes) => items.push(String::from_utf8_lossy(&bytes).into_owned()),
        Value::Array(values) | Value::Set(values) => {
            for value in values {
                flatten(value, items)?;
            }
        }
        Value::Map(pairs) => {
            for (key, value) in pairs {
                flatten(key, items)?;
                flatten(value, items)?;
            }
        }
        Value::ServerError(error) => return Err(protocol(&format!("error reply {error:?}"))),
        other => return Err(protocol(&format!("unexpected reply {other:?}"))),
    }
    Ok(())
}

fn protocol(detail: &str) -> ServerError {
    ServerError::Protocol {
        server: "Redis".to_owned(),
        detail: detail.to_owned(),
    }
}

impl From<redis::RedisError> for ServerError {
    fn from(error: redis::RedisError) -> Self {
        protocol(&error.to_string())
    }
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
