//! Client routes (admin): `PUT`, `GET` and `DELETE /clients/{client}`, `GET /clients` and
//! `POST /clients/{client}/token`. A client's token is shown once, when it is made; the
//! store keeps only its hash.

use axum::extract::{FromRequestParts, Path, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;
use super::auth::Admin;
use super::error::ApiError;
use super::extract::{Json, JsonBody};
use crate::domain::{ClientConfig, ClientConfigBody, ClientId, ClientToken};
use crate::store::{ClientRecord, PutClient};

/// The client id of a `/clients/{client}...` path, parsed.
#[derive(Debug, Clone)]
pub struct ClientPath(pub ClientId);

impl<S: Send + Sync> FromRequestParts<S> for ClientPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::InvalidClientId(crate::domain::InvalidClientId))?;
        Ok(Self(ClientId::parse(&raw)?))
    }
}

/// A client as the API shows it: its id and configuration (`pools`, and its rate limit
/// when it has one), never its token, nor its token's hash.
fn view(client: &ClientRecord) -> serde_json::Value {
    shown(&client.id, &client.config)
}

fn shown(id: &ClientId, config: &ClientConfig) -> serde_json::Value {
    let mut shown = json!({ "client": id });
    if let (Some(fields), Ok(serde_json::Value::Object(config))) =
        (shown.as_object_mut(), serde_json::to_value(config))
    {
        fields.extend(config);
    }
    shown
}

/// Creates the client (201, with its token, shown this once) or replaces the pools it may
/// use (200; its token is kept).
pub async fn put_client(
    _: Admin,
    State(state): State<AppState>,
    ClientPath(id): ClientPath,
    Json(body): Json<ClientConfigBody>,
) -> Result<Response, ApiError> {
    let config = ClientConfig::parse(&body).map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    let token = ClientToken::generate();
    let answer = match state.store.put_client(&id, &config, token.hash()).await? {
        PutClient::Created => {
            let mut created = shown(&id, &config);
            created["token"] = json!(token.reveal());
            (StatusCode::CREATED, axum::Json(created))
        }
        PutClient::Replaced => (StatusCode::OK, axum::Json(shown(&id, &config))),
    };
    Ok(answer.into_response())
}

/// Gives the client a new token, shown this once; the old one stops working at once.
pub async fn rotate_token(
    _: Admin,
    State(state): State<AppState>,
    ClientPath(id): ClientPath,
) -> Result<Response, ApiError> {
    let token = ClientToken::generate();
    state.store.rotate_client_token(&id, token.hash()).await?;
    Ok(axum::Json(json!({ "client": id, "token": token.reveal() })).into_response())
}

/// Every client, by id.
pub async fn list_clients(_: Admin, State(state): State<AppState>) -> Result<Response, ApiError> {
    let clients: Vec<serde_json::Value> = state.store.clients().await?.iter().map(view).collect();
    Ok(axum::Json(json!({ "clients": clients })).into_response())
}

/// One client.
pub async fn get_client(
    _: Admin,
    State(state): State<AppState>,
    ClientPath(id): ClientPath,
) -> Result<Response, ApiError> {
    Ok(axum::Json(view(&state.store.client(&id).await?)).into_response())
}

/// Deletes the client; its token stops working at once.
pub async fn delete_client(
    _: Admin,
    State(state): State<AppState>,
    ClientPath(id): ClientPath,
) -> Result<Response, ApiError> {
    state.store.delete_client(&id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

impl JsonBody for ClientConfigBody {}
