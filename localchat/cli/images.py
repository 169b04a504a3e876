"""Pictures on the command line and in the REPL: read and checked before any model loads, then
attached to the next question with the tokens the model's processor gives them."""

from __future__ import annotations

from typing import Any

from localchat.errors import UsageError
from localchat.registry import ModelRef
from localchat.vision.image import Picture, read_picture
from localchat.vision.support import refuse_text_only, require_extra, text_only


def read_pictures(names: tuple[str, ...], prompt: str | None, where: str = "--image") -> tuple[Picture, ...]:
    """Every ``--image`` as a checked picture (one line and exit 2 for the first that is not)."""
    if not names:
        return ()
    require_extra(where)
    if names.count("-") > 1 or ("-" in names and prompt == "-"):
        raise UsageError(f"{where} -: standard input can be read once (give the prompt as an argument)")
    return tuple(read_picture(name, where) for name in names)


def check_model_sees(ref: ModelRef | None, pictures: tuple[Picture, ...]) -> None:
    """Pictures for a model the registry or its directory calls text-only: refused before it loads
    (an unknown model behind a server is asked; the server answers for itself)."""
    if pictures and ref is not None:
        refuse_text_only(ref)


def check_backend_sees(backend: Any) -> None:
    """A model loaded here by mlx_lm is text-only (mlx-vlm's backend counts image tokens); a server's
    model answers for itself."""
    if backend.name == "inproc" and not hasattr(backend, "image_tokens"):
        raise text_only(backend.model_id)


def server_picture_tokens(ref: ModelRef | None) -> Any:
    """A server's vision model counted by its processor, when its directory is on this machine."""
    from localchat.errors import LocalchatError
    from localchat.registry import local_dir
    from localchat.vision.counting import local_picture_tokens
    from localchat.vision.support import has_extra, is_vision

    if ref is None or not has_extra() or not is_vision(ref):
        return None
    try:
        return local_picture_tokens(local_dir(ref))
    except LocalchatError:  # not on this machine: the server counts, after the fact
        return None


def counted(backend: Any, pictures: tuple[Picture, ...]) -> tuple[Picture, ...]:
    """The pictures with their token counts, when the backend's processor is here to count them."""
    count = getattr(backend, "image_tokens", None)
    return tuple(p.with_tokens(count(p.data)) for p in pictures) if count is not None else pictures


def attach(session: Any, pictures: tuple[Picture, ...], info: Any) -> None:
    """Attach ``pictures`` to the session's next question, saying what each one is."""
    if not pictures:
        return
    pictures = counted(session.backend, pictures)
    session.conversation.attached = (*session.conversation.attached, *pictures)
    for picture in pictures:
        info(f"attached {picture.ref.label()}")
