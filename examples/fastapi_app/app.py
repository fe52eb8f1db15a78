"""A FastAPI app with its own users that mounts corral under /corral.

    CORRAL_STORE=sqlite:///tmp/app.db uvicorn app:app   # from this directory

corral's API, its AG-UI endpoint (POST /corral/v1/agui) and its page (/corral/) answer only
requests this app's own authentication lets in; the app's lifespan runs corral's background
work (drives, the reaper loop) and stops it.
"""

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Header, HTTPException

from corral.server import ServerConfig, create_app

USERS = {"alice-token-0123456789": "alice"}  # stands in for the app's real user store


def current_user(authorization: str = Header("")) -> str:
    user = USERS.get(authorization.removeprefix("Bearer "))
    if user is None:
        raise HTTPException(401, "log in first")
    return user


corral_app = create_app(auth=current_user,
                        config=ServerConfig(store_url=os.environ.get("CORRAL_STORE")))


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with corral_app.running():
        yield


app = FastAPI(lifespan=lifespan)
app.mount("/corral", corral_app)


@app.get("/me")
def me(user: str = Depends(current_user)) -> dict[str, str]:
    return {"user": user}
