//! The gRPC channel to the members: tonic's balanced channel, with a wider HTTP/2
//! connection window than hyper's default.
//!
//! Why: the HTTP/2 client counts the small DATA frames it holds unread (each costs up to
//! 256 bytes of a budget half the connection window's size) and ends the whole connection
//! (`GOAWAY ENHANCE_YOUR_CALM "too_many_data_frames"`) when they exceed it. A session's
//! watch stream carries one small frame per watch made, event and cancel, and with ten
//! thousand held keys a burst of them (a release of every lock, a revoked lease) outran the
//! 2.5 MB budget of the 5 MB default window: every request in flight failed with it.

use etcd_client::{BalancedChannelBuilder, Channel};
use tokio::sync::mpsc;
use tonic::transport::channel::Change;
use tonic::transport::{Endpoint, Uri};

/// The connection window: its half, the budget of small frames held unread, is room for
/// about 130 000 of them.
const CONNECTION_WINDOW: u32 = 64 << 20;

/// Builds the balanced channel with every endpoint's connection window widened.
pub(crate) struct WideWindow;

impl BalancedChannelBuilder for WideWindow {
    type Error = tonic::transport::Error;

    fn balanced_channel(
        self,
        buffer_size: usize,
    ) -> Result<(Channel, mpsc::Sender<Change<Uri, Endpoint>>), Self::Error> {
        let (channel, members) = tonic::transport::Channel::balance_channel::<Uri>(buffer_size);
        let (updates, mut asked) = mpsc::channel::<Change<Uri, Endpoint>>(buffer_size);
        // The client sends its endpoints here as it connects; each goes on, widened.
        tokio::spawn(async move {
            while let Some(change) = asked.recv().await {
                let change = match change {
                    Change::Insert(uri, endpoint) => Change::Insert(
                        uri,
                        endpoint.initial_connection_window_size(CONNECTION_WINDOW),
                    ),
                    other => other,
                };
                if members.send(change).await.is_err() {
                    return;
                }
            }
        });
        Ok((Channel::Tonic(channel), updates))
    }
}
