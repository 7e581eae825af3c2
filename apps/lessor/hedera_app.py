"""os-ken/Ryu app: Hedera (Global First Fit, 5 s polling) on LESSOR's machinery."""

from apps.lessor.app import LessorApp
from apps.lessor.hedera_logic import HederaLogic


class HederaApp(LessorApp):
    LOGIC = HederaLogic
