"""The Keysight N77xx emulator's SCPI status registers (SCPI-99 chapter 9; the guides' STATus
subsystem): OPERation and QUEStionable, each with condition, event, enable and both transition
filters (OPERation bit n: channel n's function running; QUEStionable bit n: channel n over
range)."""

from __future__ import annotations

from lumion_hil.instruments.emulators.keysight_n77xx_channels import N77xxChannels
from lumion_hil.instruments.emulators.keysight_n77xx_tables import REGISTER
from lumion_hil.instruments.emulators.scpi_grammar import no_args


class N77xxStatus(N77xxChannels):
    """The status registers, following the channels' functions and the meter's faults."""

    def _preset_status(self) -> None:
        self.status = {name: {"CONDition": 0, "EVENt": 0, "ENABle": 0, "PTRansition": 32767, "NTRansition": 0}
                       for name in ("OPERation", "QUEStionable")}

    def _conditions(self) -> dict[str, int]:
        operation = questionable = 0
        for n, ch in self.channels.items():
            if self._running(ch):
                operation |= 1 << n  # channel n's summary: a data acquisition function in progress
            if "out_of_range" in self.faults:
                questionable |= 1 << n  # channel n's summary: its reading is over range
        return {"OPERation": operation, "QUEStionable": questionable}

    def _update_status(self) -> None:
        for name, now in self._conditions().items():
            register = self.status[name]
            before = register["CONDition"]
            rose, fell = now & ~before, before & ~now
            register["EVENt"] |= (rose & register["PTRansition"]) | (fell & register["NTRansition"])
            register["CONDition"] = now

    def handle_line(self, line: str):
        self._update_status()
        return super().handle_line(line)

    def status_byte(self) -> int:
        self._update_status()
        return super().status_byte()

    def _status_commands(self) -> None:
        c = self.command
        for name in ("OPERation", "QUEStionable"):
            def event(args: str, n=name) -> str:
                no_args(args)
                self._update_status()
                value, self.status[n]["EVENt"] = self.status[n]["EVENt"], 0  # reading clears it
                return f"+{value}"

            def condition(args: str, n=name) -> str:
                no_args(args)
                self._update_status()
                return f"+{self.status[n]['CONDition']}"

            c(f":STATus:{name}[:EVENt]?", event)
            c(f":STATus:{name}:CONDition?", condition)
            for register in ("ENABle", "PTRansition", "NTRansition"):
                c(f":STATus:{name}:{register}",
                  lambda a, n=name, r=register: self.status[n].__setitem__(r, int(REGISTER.parse(a))))
                c(f":STATus:{name}:{register}?", lambda a, n=name, r=register: f"+{self.status[n][r]}")

        def preset(args: str) -> None:
            no_args(args)
            for register in self.status.values():
                register.update(ENABle=0, PTRansition=32767, NTRansition=0)

        c(":STATus:PRESet", preset)
