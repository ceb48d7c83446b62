//! Reading a rule's nft text back into its value ([`Rule`]'s `FromStr`): the tests'
//! way from rendered text to a value, and tools'.

use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;

use super::*;
/// Rules written as nft text (tests and tools), or the first one outside the vocabulary.
pub fn parse_all<'a>(texts: impl IntoIterator<Item = &'a str>) -> Result<Vec<Rule>, ParseError> {
    texts.into_iter().map(str::parse).collect()
}

/// Split a rule into words, a `"…"` string (without escapes: the compiler writes none)
/// being one word with its quotes.
fn words(rule: &str) -> Result<Vec<&str>, ParseError> {
    let mut out = Vec::new();
    let mut rest = rule.trim_start();
    while !rest.is_empty() {
        let end = if let Some(quoted) = rest.strip_prefix('"') {
            match quoted.find('"') {
                Some(i) => i + 2,
                None => return Err(ParseError { word: rest.to_string(), expected: "a closing `\"`" }),
            }
        } else {
            rest.find(char::is_whitespace).unwrap_or(rest.len())
        };
        out.push(&rest[..end]);
        rest = rest[end..].trim_start();
    }
    Ok(out)
}

/// An address or a prefix of `family` without host bits.
fn prefix_of(w: &str, family: Family) -> Option<IpNet> {
    let net = match w.parse::<IpNet>() {
        Ok(net) => net,
        Err(_) => IpNet::from(w.parse::<IpAddr>().ok()?),
    };
    (net.trunc() == net && Family::of(net.addr()) == family).then_some(net)
}

/// The words of a rule, read from the front.
struct Words<'a> {
    w: Vec<&'a str>,
    i: usize,
}

impl<'a> Words<'a> {
    fn peek(&self, ahead: usize) -> Option<&'a str> {
        self.w.get(self.i + ahead).copied()
    }

    /// Whether the next words are `phrase` (not consumed).
    fn at(&self, phrase: &[&str]) -> bool {
        self.w.get(self.i..self.i + phrase.len()) == Some(phrase)
    }

    /// Consume `phrase` if the next words are it.
    fn eat(&mut self, phrase: &[&str]) -> bool {
        let at = self.at(phrase);
        if at {
            self.i += phrase.len();
        }
        at
    }

    fn fail<T>(&self, expected: &'static str) -> Result<T, ParseError> {
        Err(ParseError { word: self.peek(0).unwrap_or("").to_string(), expected })
    }

    fn expect(&mut self, phrase: &[&str], expected: &'static str) -> Result<(), ParseError> {
        if self.eat(phrase) { Ok(()) } else { self.fail(expected) }
    }

    /// The next word, parsed by `read`.
    fn take<T>(&mut self, expected: &'static str, read: impl FnOnce(&'a str) -> Option<T>) -> Result<T, ParseError> {
        match self.peek(0).and_then(read) {
            Some(v) => {
                self.i += 1;
                Ok(v)
            }
            None => self.fail(expected),
        }
    }

    fn number<T: FromStr>(&mut self, expected: &'static str) -> Result<T, ParseError> {
        self.take(expected, |w| w.parse().ok())
    }

    fn mark(&mut self) -> Result<u32, ParseError> {
        self.take("a 32-bit mark", |w| match w.strip_prefix("0x") {
            Some(hex) => u32::from_str_radix(hex, 16).ok(),
            None => w.parse().ok(),
        })
    }

    fn set(&mut self) -> Result<Name, ParseError> {
        self.take("a set (`@name`)", |w| w.strip_prefix('@').filter(|n| !n.is_empty()).map(Name::from))
    }

    fn quoted(&mut self) -> Result<Name, ParseError> {
        self.take("a string in quotes", |w| {
            (w.len() >= 2 && w.starts_with('"') && w.ends_with('"')).then(|| Name::from(&w[1..w.len() - 1]))
        })
    }

    fn family(&mut self) -> Result<Family, ParseError> {
        self.take("`ip` or `ip6`", |w| match w {
            "ip" => Some(Family::V4),
            "ip6" => Some(Family::V6),
            _ => None,
        })
    }

    fn field(&mut self) -> Result<AddrField, ParseError> {
        self.take("`saddr` or `daddr`", |w| match w {
            "saddr" => Some(AddrField::Saddr),
            "daddr" => Some(AddrField::Daddr),
            _ => None,
        })
    }

    fn proto(&mut self) -> Result<Proto, ParseError> {
        self.take("`tcp`, `udp` or `sctp`", Proto::from_word)
    }

    /// The items of a `{ a, b . c, … }` list, each read by `item` from its words.
    fn braced<T>(&mut self, item: impl Fn(&[&str]) -> Option<T>, expected: &'static str) -> Result<Vec<T>, ParseError> {
        self.expect(&["{"], "`{`")?;
        let mut items = vec![Vec::new()];
        loop {
            let word = self.take("`}`", Some)?;
            if word == "}" {
                break;
            }
            let (word, last) = match word.strip_suffix(',') {
                Some(x) => (x, true),
                None => (word, false),
            };
            if let (false, Some(current)) = (word == ".", items.last_mut()) {
                current.push(word);
            }
            if last {
                items.push(Vec::new());
            }
        }
        let read: Option<Vec<T>> = items.iter().map(|words| item(words)).collect();
        match read {
            Some(read) if !read.is_empty() => Ok(read),
            _ => Err(ParseError { word: items.concat().join(" "), expected }),
        }
    }
}

impl Words<'_> {
    /// A match at the front, if one starts there. One arm per phrase of the vocabulary
    /// ([`Match`]'s variants): a table, kept whole (ARCHITECTURE.md, units).
    fn a_match(&mut self) -> Result<Option<Match>, ParseError> {
        let m = match (self.peek(0), self.peek(1)) {
            (Some("meta"), Some("nfproto")) => {
                self.i += 2;
                let f = self.take("`ipv4` or `ipv6`", |w| match w {
                    "ipv4" => Some(Family::V4),
                    "ipv6" => Some(Family::V6),
                    _ => None,
                })?;
                Match::Nfproto(f)
            }
            (Some("ip" | "ip6"), Some("saddr" | "daddr")) if self.peek(2) != Some("vmap") => {
                let (family, field) = (self.family()?, self.field()?);
                if self.eat(&["and"]) {
                    let mask = self.take("a mask of the family", |w| {
                        w.parse::<IpAddr>().ok().filter(|m| Family::of(*m) == family)
                    })?;
                    Match::AddrMaskedIn { family, field, mask, set: self.set()? }
                } else if self.peek(0).is_some_and(|w| w.starts_with('@')) {
                    Match::AddrIn { family, field, set: self.set()?, negated: false }
                } else if self.eat(&["!="]) {
                    Match::AddrIn { family, field, set: self.set()?, negated: true }
                } else if self.peek(0) == Some("{") {
                    let nets = self.braced(
                        |item| match item {
                            [w] => prefix_of(w, family),
                            _ => None,
                        },
                        "addresses or prefixes of the family without host bits",
                    )?;
                    Match::AddrAnyOf { family, field, nets }
                } else {
                    let net =
                        self.take("an address or a prefix of the family without host bits", |w| prefix_of(w, family))?;
                    Match::Addr { family, field, net }
                }
            }
            (Some("tcp"), Some("flags")) => {
                self.expect(&["tcp", "flags", "syn"], "`tcp flags syn`")?;
                Match::TcpSyn
            }
            (Some(raw), _) if raw.starts_with("@th,") => {
                let bits: Option<Vec<u32>> = raw[4..].split(',').map(|p| p.parse().ok()).collect();
                let Some([offset, bits]) = bits.as_deref().and_then(|b| <[u32; 2]>::try_from(b).ok()) else {
                    return self.fail("`@th,<offset>,<bits>`");
                };
                self.i += 1;
                Match::ThBits { offset, bits, value: self.number("a number")? }
            }
            (Some("tcp" | "udp" | "sctp"), Some("dport")) => {
                let p = self.proto()?;
                self.i += 1;
                Match::Dport(p, self.number("a port")?)
            }
            (Some("icmpv6"), Some("type")) => {
                self.i += 2;
                let types = self.braced(
                    |item| match item {
                        [w] => Icmpv6Type::ALL.iter().find(|(_, word, _)| word == w).map(|(t, ..)| *t),
                        _ => None,
                    },
                    "neighbour discovery types",
                )?;
                Match::Icmpv6Types(types)
            }
            (Some("meta"), Some("l4proto")) => {
                if self.eat(&["meta", "l4proto", ".", "th", "dport", "."]) {
                    let family = self.family()?;
                    self.expect(&["daddr"], "`daddr`")?;
                    Match::ProtoPortAddrIn { family, set: self.set()? }
                } else if self.eat(&["meta", "l4proto", ".", "th", "dport"]) {
                    Match::ProtoPortIn(self.braced(
                        |item| match item {
                            [p, port] => Some((Proto::from_word(p)?, port.parse().ok()?)),
                            _ => None,
                        },
                        "`<protocol> . <port>` pairs",
                    )?)
                } else if self.peek(2) == Some("{") {
                    self.i += 2;
                    Match::ProtoIn(self.braced(
                        |item| match item {
                            [p] => Proto::from_word(p),
                            _ => None,
                        },
                        "protocols",
                    )?)
                } else {
                    self.i += 2;
                    Match::Proto(self.proto()?)
                }
            }
            (Some(m @ ("meta" | "ct")), Some("mark")) if self.peek(2) == Some("and") => {
                let of = if m == "meta" { MarkOf::Packet } else { MarkOf::Conn };
                self.i += 3;
                let mask = self.mark()?;
                if of == MarkOf::Conn && self.peek(0).is_some_and(|w| w.starts_with('@')) {
                    Match::CtMarkIn { mask, or: None, set: self.set()? }
                } else if of == MarkOf::Conn && self.eat(&["or"]) {
                    let or = Some(self.mark()?);
                    Match::CtMarkIn { mask, or, set: self.set()? }
                } else {
                    let cmp = self.take("`==` or `!=`", |w| match w {
                        "==" => Some(Cmp::Eq),
                        "!=" => Some(Cmp::Neq),
                        _ => None,
                    })?;
                    Match::Mark { of, mask, cmp, value: self.mark()? }
                }
            }
            (Some("ct"), Some("state")) => {
                self.i += 2;
                Match::CtState(self.take("`new` or `established`", |w| match w {
                    "new" => Some(CtState::New),
                    "established" => Some(CtState::Established),
                    _ => None,
                })?)
            }
            (Some("ct"), Some("direction")) => {
                self.i += 2;
                Match::CtDirection(self.take("`original` or `reply`", |w| match w {
                    "original" => Some(Direction::Original),
                    "reply" => Some(Direction::Reply),
                    _ => None,
                })?)
            }
            (Some("ct"), Some("original")) => {
                self.i += 2;
                if self.eat(&["proto-dst"]) {
                    Match::CtOriginalProtoDst(self.number("a port")?)
                } else {
                    let (family, field) = (self.family()?, self.field()?);
                    Match::CtOriginalAddrIn { family, field, set: self.set()? }
                }
            }
            (Some("rt"), _) => {
                self.i += 1;
                let family = self.family()?;
                self.expect(&["nexthop"], "`nexthop`")?;
                let negated = self.eat(&["!="]);
                Match::RtNexthopIn { family, set: self.set()?, negated }
            }
            (Some("fib"), _) => {
                self.expect(&["fib", "saddr", ".", "iif", "oif", "missing"], "`fib saddr . iif oif missing`")?;
                Match::FibSaddrIifMissing
            }
            (Some("th"), _) => {
                self.i += 1;
                let field = self.take("`sport` or `dport`", |w| match w {
                    "sport" => Some(PortField::Sport),
                    "dport" => Some(PortField::Dport),
                    _ => None,
                })?;
                Match::ThPort(field, self.number("a port")?)
            }
            (Some("numgen"), _) => {
                self.expect(&["numgen", "random", "mod", "1", "offset"], "a tagged lookup")?;
                let hi: u32 = self.number("a 32-bit number")?;
                self.expect(&[".", "numgen", "random", "mod", "1", "offset"], "a tagged lookup")?;
                let lo: u32 = self.number("a 32-bit number")?;
                self.expect(&["."], "`.`")?;
                let family = self.family()?;
                self.expect(&["daddr"], "`daddr`")?;
                Match::TaggedIn { tag: (u64::from(hi) << 32) | u64::from(lo), family, set: self.set()? }
            }
            _ => return Ok(None),
        };
        Ok(Some(m))
    }

    /// A statement at the front, if one starts there.
    fn a_statement(&mut self) -> Result<Option<Statement>, ParseError> {
        let s = match (self.peek(0), self.peek(1)) {
            (Some("ip" | "ip6"), Some("dscp")) => {
                let family = self.family()?;
                self.expect(&["dscp", "set"], "`dscp set`")?;
                Statement::Dscp(family, self.take("a DSCP of 0-63", |w| w.parse().ok().filter(|d| *d < 64))?)
            }
            (Some(m @ ("meta" | "ct")), Some("mark")) if self.peek(2) == Some("set") => {
                let of = if m == "meta" { MarkOf::Packet } else { MarkOf::Conn };
                self.i += 3;
                self.expect(&[m, "mark"], "the same mark")?;
                if of == MarkOf::Conn && self.eat(&["or"]) {
                    Statement::CtMarkOr(self.mark()?)
                } else {
                    self.expect(&["and"], "`and` or `or`")?;
                    let keep = self.mark()?;
                    self.expect(&["or"], "`or`")?;
                    Statement::SetMark { of, keep, or: self.mark()? }
                }
            }
            (Some("tcp"), Some("option")) => {
                self.expect(&["tcp", "option", "maxseg", "size", "set", "rt", "mtu"], "`... maxseg size set rt mtu`")?;
                Statement::MssToRoute
            }
            (Some("notrack"), _) => {
                self.i += 1;
                Statement::Notrack
            }
            (Some("tproxy"), _) => {
                self.i += 1;
                let family = self.family()?;
                self.expect(&["to"], "`to`")?;
                Statement::Tproxy(family, self.take("`:<port>`", |w| w.strip_prefix(':')?.parse().ok())?)
            }
            (Some("snat"), _) => {
                self.i += 1;
                let family = self.family()?;
                self.expect(&["to"], "`to`")?;
                if self.eat(&[family.word(), "saddr"]) {
                    Statement::SnatToSaddr(family)
                } else {
                    let ip = self.take("an address of the family", |w| {
                        w.parse::<IpAddr>().ok().filter(|ip| Family::of(*ip) == family)
                    })?;
                    Statement::SnatTo(ip)
                }
            }
            (Some("limit"), _) => {
                self.expect(&["limit", "rate"], "`limit rate`")?;
                let over = self.eat(&["over"]);
                let rate = self.take("`<n>/second`", |w| w.strip_suffix("/second")?.parse().ok())?;
                self.expect(&["burst"], "`burst`")?;
                let burst = self.number("a number")?;
                self.expect(&["packets"], "`packets`")?;
                Statement::Limit { rate, burst, over }
            }
            (Some("log"), _) => {
                self.expect(&["log", "prefix"], "`log prefix`")?;
                let prefix = self.quoted()?;
                self.expect(&["group"], "`log prefix \"…\" group <n>`")?;
                let group = self.number("a log group of 0-65535")?;
                let queue_threshold =
                    if self.eat(&["queue-threshold"]) { Some(self.number("a threshold of 0-65535")?) } else { None };
                Statement::Log { prefix, group, queue_threshold }
            }
            (Some("meta"), Some("priority")) if self.peek(2) == Some("set") => {
                self.i += 3;
                if self.eat(&["none"]) {
                    Statement::PriorityNone
                } else {
                    let (family, field) = (self.family()?, self.field()?);
                    self.expect(&["map"], "`map`")?;
                    Statement::PriorityFromMap { family, field, map: self.set()? }
                }
            }
            (Some("counter"), Some("name")) => {
                self.i += 2;
                Statement::NamedCounter(self.quoted()?)
            }
            (Some("counter"), _) => {
                self.i += 1;
                Statement::Counter
            }
            _ => return Ok(None),
        };
        Ok(Some(s))
    }

    fn a_verdict(&mut self) -> Result<Option<Verdict>, ParseError> {
        let v = match self.peek(0) {
            Some("accept") => Verdict::Accept,
            Some("drop") => Verdict::Drop,
            Some("return") => Verdict::Return,
            Some(j @ ("jump" | "goto")) => {
                self.i += 1;
                let chain = self.take("a chain", |w| (!w.starts_with('"')).then(|| Name::from(w)))?;
                return Ok(Some(if j == "jump" { Verdict::Jump(chain) } else { Verdict::Goto(chain) }));
            }
            Some("meta") if self.at(&["meta", "priority", "vmap"]) => {
                self.i += 3;
                return Ok(Some(Verdict::PriorityMap(self.set()?)));
            }
            Some("ip" | "ip6") if self.peek(2) == Some("vmap") => {
                let (family, field) = (self.family()?, self.field()?);
                self.i += 1;
                return Ok(Some(Verdict::Map { family, field, map: self.set()? }));
            }
            _ => return Ok(None),
        };
        self.i += 1;
        Ok(Some(v))
    }
}

impl FromStr for Rule {
    type Err = ParseError;

    /// Read a rule of the vocabulary: matches, statements, a verdict, a comment, in
    /// that order.
    fn from_str(text: &str) -> Result<Self, ParseError> {
        let mut w = Words { w: words(text)?, i: 0 };
        let mut rule = Rule::default();
        while let Some(m) = w.a_match()? {
            rule.matches.push(m);
        }
        while let Some(s) = w.a_statement()? {
            rule.statements.push(s);
        }
        rule.verdict = w.a_verdict()?;
        if w.eat(&["comment"]) {
            rule.comment = Some(w.quoted()?);
        }
        if w.peek(0).is_some() {
            return w.fail(if rule.comment.is_some() {
                "nothing after the comment"
            } else if rule.verdict.is_some() {
                "nothing but a comment after the verdict"
            } else {
                "a match, a statement or a verdict of the vocabulary"
            });
        }
        Ok(rule)
    }
}
