//! `sipsec users add | remove | list | import`: managing the user database a server with
//! digest authentication checks against. The database and realm come from the server's
//! config (`--config`, or the embedded defaults), so the command and the server agree; a
//! running server picks the change up within a second.

use crate::auth::credentials::Secrets;
use crate::config::Config;
use crate::db::store::Store;
use crate::db::users;
use anyhow::{bail, Context, Result};
use std::io::BufRead;
use std::path::PathBuf;

/// `sipsec users`' arguments.
#[derive(clap::Args, Debug)]
pub struct UsersArgs {
    /// The server's config file: its database and `[auth] realm` (default: the embedded
    /// defaults, `sqlite://sipsec.db` and realm `localhost`).
    #[arg(long, short, global = true)]
    pub config: Option<PathBuf>,
    /// Realm to manage instead of the config's.
    #[arg(long, global = true)]
    pub realm: Option<String>,
    #[command(subcommand)]
    pub(crate) action: UsersAction,
}

#[derive(clap::Subcommand, Debug)]
pub(crate) enum UsersAction {
    /// Add a user, or change an existing user's password.
    Add {
        /// The user name (the user part of the user's SIP URI).
        username: String,
        /// The password (default: read one line from stdin, so it stays out of shell history).
        #[arg(long)]
        password: Option<String>,
    },
    /// Remove a user.
    Remove {
        /// The user name.
        username: String,
    },
    /// List the realm's users.
    List,
    /// Add or replace users from a CSV file of `username,password` lines.
    Import {
        /// The CSV file: one `username,password` a line.
        file: PathBuf,
    },
}

/// Runs `sipsec users`: opens the config's database and adds, removes, lists or imports users of
/// the realm.
pub fn run(args: UsersArgs) -> Result<()> {
    let cfg = match &args.config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    let realm = args
        .realm
        .clone()
        .unwrap_or_else(|| cfg.auth.scope.realm.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store = Store::connect(&cfg.database_url).await?;
        // On stderr, so `list` stays a plain list.
        eprintln!("database: {}", crate::db::store::redacted(&cfg.database_url));
        match args.action {
            UsersAction::Add { username, password } => {
                if !users::valid_username(&username) {
                    bail!("{username:?} is not a valid user name (letters, digits and -_.!~*'()&=+$;?/)");
                }
                let password = match password {
                    Some(p) => p,
                    None => {
                        let mut line = String::new();
                        std::io::stdin()
                            .lock()
                            .read_line(&mut line)
                            .context("cannot read the password from stdin")?;
                        line.trim_end_matches(['\r', '\n']).to_string()
                    }
                };
                if password.is_empty() {
                    bail!("the password is empty");
                }
                let ha1s = Secrets::from_password(&username, &realm, &password);
                store.put_users(&realm, &[(username.clone(), ha1s)]).await?;
                println!("user {username} of realm {realm} stored");
            }
            UsersAction::Remove { username } => {
                if !store.remove_user(&realm, &username).await? {
                    bail!("realm {realm} has no user {username:?}");
                }
                println!("user {username} of realm {realm} removed");
            }
            UsersAction::List => {
                for name in store.list_users(&realm).await? {
                    println!("{name}");
                }
            }
            UsersAction::Import { file } => {
                let started = std::time::Instant::now();
                let n = users::import_csv(&store, &realm, &file).await?;
                println!(
                    "{n} users of realm {realm} imported in {:.1} s",
                    started.elapsed().as_secs_f64()
                );
            }
        }
        // Closed, not dropped: SQLite then moves what the write-ahead log holds into the
        // database file, so a copy of the file alone has everything written here.
        store.close().await;
        anyhow::Ok(())
    })
}
