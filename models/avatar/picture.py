"""What both avatar bundle kinds share about the picture they show."""


class PictureSize:
    """``width`` / ``height`` in px of what an avatar shows, from its ``portrait`` (``uint8 [H, W, 3]``):
    shared by both bundle kinds."""

    @property
    def width(self) -> int:
        return int(self.portrait.shape[1])

    @property
    def height(self) -> int:
        return int(self.portrait.shape[0])
