"""Request-scoped access to the database and settings held on app.state."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from app.config import Settings
from app.db.session import Database


# async: plain attribute reads; FastAPI runs a sync dependency in the thread pool (a hop per request)
async def get_db(request: Request) -> Database:
    return request.app.state.db


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


DbDep = Annotated[Database, Depends(get_db)]
SettingsDep = Annotated[Settings, Depends(get_settings)]

# path ids: bounded, so a huge id is a 422 and never reaches the database
IdPath = Annotated[int, Path(ge=1, le=2**63 - 1)]
LeaseId = Annotated[str, Path(min_length=1, max_length=36, pattern=r"^[0-9a-fA-F-]+$")]
