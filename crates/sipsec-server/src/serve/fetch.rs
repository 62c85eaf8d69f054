//! Fetching credentials off the workers' threads: the channel a worker's engine asks through
//! (`Effects::fetches`), and the fetcher that answers from the user database when digest runs
//! without its cache (`spawn_user_fetcher`; the Proxychain authority's is
//! [`super::authority`]). Either tells every worker when an answer is in, so the requests
//! parked for it run.

use super::mailbox::{credentials_ready, MailboxSender};
use crate::db::store::Store;
use std::sync::Arc;
use std::time::Duration;

/// A request for a user's credentials from somewhere slow (the Proxychain authority, or the
/// user database when digest runs without its cache), made by a worker's authenticator.
#[derive(Debug)]
pub struct Fetch {
    /// The user whose credentials are wanted.
    pub user: String,
    /// Ahead of need: no request waits for it.
    pub prefetch: bool,
    /// The worker that asked.
    pub worker: usize,
}

/// Where the workers send fetches; whoever serves them tells every worker when a user's
/// answer is in (`engine::Mail::Credential`), so the requests that waited run.
#[derive(Clone)]
pub struct FetchHandle {
    tx: tokio::sync::mpsc::UnboundedSender<Fetch>,
}

impl FetchHandle {
    /// A handle and the receiving end its fetches arrive at.
    pub fn new() -> (FetchHandle, tokio::sync::mpsc::UnboundedReceiver<Fetch>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (FetchHandle { tx }, rx)
    }

    /// Asks for `user`'s credentials on behalf of `worker`; a fetcher that has stopped is ignored.
    pub fn fetch(&self, user: String, prefetch: bool, worker: usize) {
        let _ = self.tx.send(Fetch {
            user,
            prefetch,
            worker,
        });
    }
}

/// Digest without the credential cache: answers each fetch with its own query to the
/// database at `url` (several in flight at once, up to the pool's connections), delivers the
/// answer to `fetched` for the worker that asked and tells it. A failed query delivers
/// nothing, so the requests that waited are answered 503.
pub(crate) fn spawn_user_fetcher(
    runtime: &tokio::runtime::Runtime,
    url: String,
    realm: String,
    fetched: Arc<crate::auth::digest::DigestShared>,
    workers: Vec<MailboxSender>,
) -> FetchHandle {
    let (handle, mut rx) = FetchHandle::new();
    runtime.spawn(async move {
        let store = loop {
            match Store::connect(&url).await {
                Ok(s) => break Arc::new(s),
                Err(e) => {
                    tracing::error!("user database unavailable ({e:#}); retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        while let Some(f) = rx.recv().await {
            let (store, realm, shared, workers) = (
                store.clone(),
                realm.clone(),
                fetched.clone(),
                workers.clone(),
            );
            tokio::spawn(async move {
                match store.user_secrets(&realm, &f.user).await {
                    Ok(answer) => shared.fetched.deliver(f.worker, &f.user, answer),
                    Err(e) => tracing::warn!(user = %f.user, "user query failed: {e:#}"),
                }
                if let Some(w) = workers.get(f.worker) {
                    credentials_ready(std::slice::from_ref(w), &f.user);
                }
            });
        }
    });
    handle
}
