//! The Proxychain authority's table of revoked proxies (`sipsec authd revoke`): a proxy named
//! there gets no chains, and its connection is refused.

use super::store::Store;
use anyhow::Result;
use sqlx::Row;
use std::collections::HashSet;

impl Store {
    /// Marks a proxy revoked, or allowed again.
    pub(crate) async fn set_proxy_revoked(&self, name: &str, revoked: bool) -> Result<()> {
        let d = self.dialect();
        sqlx::query(&d.sql("DELETE FROM sipsec_revoked_proxies WHERE name = ?"))
            .bind(name.to_string())
            .execute(self.pool())
            .await?;
        if revoked {
            sqlx::query(
                &d.sql("INSERT INTO sipsec_revoked_proxies (name, revoked_at) VALUES (?, ?)"),
            )
            .bind(name.to_string())
            .bind(crate::auth::proxychain::wire::unix_s() as i64)
            .execute(self.pool())
            .await?;
        }
        Ok(())
    }

    pub(crate) async fn revoked_proxies(&self) -> Result<HashSet<String>> {
        let rows = sqlx::query("SELECT name FROM sipsec_revoked_proxies")
            .fetch_all(self.pool())
            .await?;
        rows.iter()
            .map(|r| r.try_get::<String, _>(0).map_err(Into::into))
            .collect()
    }
}
